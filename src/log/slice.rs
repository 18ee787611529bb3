//! A byte range of a segment file, handed out by a read instead of the bytes
//! themselves. The Fetch path writes it to the socket straight from the page
//! cache (`sendfile`), so record data is never copied into the broker's
//! memory; [`FileSlice::read_to`] is the copying path for transports that
//! must see the bytes (TLS) and for the broker's own uses.
//!
//! The slice holds the file open: a segment deleted by retention after the
//! read still sends what was read. A segment truncated after the read (a
//! leader demoted and cut back) ends early; the sender then fails the
//! connection rather than send a short frame, as Kafka does.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

/// `len` bytes of `file` from `position`.
#[derive(Debug, Clone)]
pub struct FileSlice {
    file: Arc<File>,
    position: u64,
    len: u64,
}

impl FileSlice {
    pub fn new(file: Arc<File>, position: u64, len: u64) -> Self {
        Self { file, position, len }
    }

    /// The empty slice.
    pub fn empty() -> Self {
        static NONE: std::sync::OnceLock<Arc<File>> = std::sync::OnceLock::new();
        let file = NONE.get_or_init(|| Arc::new(File::open("/dev/null").expect("/dev/null opens")));
        Self { file: file.clone(), position: 0, len: 0 }
    }

    pub fn len(&self) -> usize {
        self.len as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn file(&self) -> &File {
        &self.file
    }

    pub fn position(&self) -> u64 {
        self.position
    }

    /// Appends the slice's bytes to `out` (meant to be a buffer reused from
    /// call to call, so growing it costs a page fault only the first time).
    /// Fails with `UnexpectedEof` if the file was cut short since the read.
    pub fn read_to(&self, out: &mut Vec<u8>) -> std::io::Result<()> {
        let start = out.len();
        out.resize(start + self.len(), 0);
        let result = self.file.read_exact_at(&mut out[start..], self.position);
        if result.is_err() {
            out.truncate(start);
        }
        result
    }

    /// The slice's bytes in a new buffer.
    pub fn to_vec(&self) -> std::io::Result<Vec<u8>> {
        let mut out = Vec::new();
        self.read_to(&mut out)?;
        Ok(out)
    }
}
