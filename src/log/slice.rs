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

/// `/dev/null`, open for reading and writing: the file of empty slices, and
/// where warming sends what it reads.
fn dev_null() -> &'static Arc<File> {
    static NULL: std::sync::OnceLock<Arc<File>> = std::sync::OnceLock::new();
    NULL.get_or_init(|| {
        Arc::new(std::fs::OpenOptions::new().read(true).write(true).open("/dev/null").expect("/dev/null opens"))
    })
}

/// Bytes read per call when warming a slice.
const WARM_CHUNK: usize = 1 << 20;

impl FileSlice {
    pub fn new(file: Arc<File>, position: u64, len: u64) -> Self {
        Self { file, position, len }
    }

    /// Reads the slice once and forgets the bytes, so that its pages are in
    /// the page cache when it is read or sent. Blocks on the disk: a Fetch
    /// far behind its log's end warms its range this way on a blocking
    /// thread first (see `PartitionLog::prefetch_range`), so that reading
    /// its batch headers under the partition's lock and sending its records
    /// from the connection's async thread do not wait for the disk (what
    /// Kafka's KAFKA-7504 does for lagging consumers).
    ///
    /// The pages are read with `sendfile` to `/dev/null`, which brings them
    /// into the page cache without copying them out; where that is refused,
    /// with `pread` into a scratch buffer.
    pub fn warm(&self) -> std::io::Result<()> {
        let mut offset = self.position;
        let end = self.position + self.len;
        while offset < end {
            let count = ((end - offset) as usize).min(WARM_CHUNK);
            match rustix::fs::sendfile(&**dev_null(), &*self.file, Some(&mut offset), count) {
                Ok(0) => return Ok(()), // cut short since the read: the send reports it
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(_) => break, // not supported here: copy instead
            }
        }
        let mut scratch = vec![0u8; WARM_CHUNK.min((end - offset) as usize)];
        while offset < end {
            let n = (end - offset).min(scratch.len() as u64) as usize;
            match self.file.read_at(&mut scratch[..n], offset)? {
                0 => break,
                read => offset += read as u64,
            }
        }
        Ok(())
    }

    /// The empty slice.
    pub fn empty() -> Self {
        Self { file: dev_null().clone(), position: 0, len: 0 }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warming_reads_the_range_and_changes_nothing() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("0.log");
        let bytes: Vec<u8> = (0..3 * WARM_CHUNK + 10).map(|i| i as u8).collect();
        std::fs::write(&path, &bytes)?;
        let file = Arc::new(File::open(&path)?);
        let slice = FileSlice::new(file.clone(), 5, (3 * WARM_CHUNK) as u64);
        slice.warm()?;
        assert_eq!(slice.to_vec()?, bytes[5..5 + 3 * WARM_CHUNK]);
        assert_eq!(std::fs::read(&path)?, bytes);
        // A file cut short since the read warms what is left.
        FileSlice::new(file, 0, (4 * WARM_CHUNK) as u64).warm()?;
        Ok(())
    }
}
