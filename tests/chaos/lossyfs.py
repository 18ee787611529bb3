#!/usr/bin/env python3
"""lossyfs: a FUSE passthrough file system that loses every write not yet fsynced when
told to, like a machine losing power (the power nemesis of tests/chaos; after Jepsen's
LazyFS, which cannot be built here).

  python3 lossyfs.py BACKING MOUNTPOINT --control NAME

Everything under MOUNTPOINT is BACKING's, with these semantics:

- File data written is held in memory, per file (per backing inode, so it follows renames
  and hard links), in 4 KiB pages over the backing file, until the file is fsynced or
  fdatasynced (through any descriptor): then it is written to the backing file. Closing a
  file persists nothing (the page cache does not either). Reads and sizes see the held
  writes, so the file system behaves as usual until the power goes. sync_file_range(2)
  never reaches a FUSE file system, so it persists nothing either (as its man page warns:
  no metadata, no guarantee).
- Metadata operations (create, mkdir, rename, unlink, rmdir, link, symlink, chmod,
  truncate) go to BACKING at once: they are persisted as they happen, without a directory
  fsync (as LazyFS does; missing directory fsyncs are not tested). A file's length after a
  power loss is therefore its length at its last fsync or truncate.
- The control socket (the abstract Unix socket NAME) takes one line: `drop` loses every
  held write, i.e. the power failed (the caller kills every process writing here first);
  `sync` persists everything; `stats` reports what is held. Each gets one line back.
- Unmounting persists everything held (a clean shutdown), so BACKING then has it all.

fsync writes the held pages into the backing file but does not fsync the backing file
itself: the host does not lose power, only this file system's model of it. The mount is
direct_io with no attribute or entry caching, so the kernel's page cache never serves a
write that was dropped.

Uses fusepy (ctypes over libfuse 2): pure Python, no build step.
"""
import argparse
import errno
import json
import os
import socket
import stat
import sys
import threading

PAGE = 4096


class Pending:
    """One file's writes since its last fsync: whole pages over the backing file."""

    def __init__(self, fd, size):
        self.lock = threading.Lock()
        self.fd = fd          # our own descriptor of the backing file (to persist through)
        self.size = size      # the file's length as the application sees it
        self.pages = {}       # page number -> bytearray(PAGE)
        self.dropped = False  # lost in a power failure: a writer that held it starts over
        self.path = None      # the path it was last written through (for reports)

    def held_bytes(self):
        return len(self.pages) * PAGE


def _runs(numbers):
    """Consecutive runs of sorted page numbers: [(first, count), ...]."""
    out = []
    for n in numbers:
        if out and out[-1][0] + out[-1][1] == n:
            out[-1][1] += 1
        else:
            out.append([n, 1])
    return out


class LossyFS:
    """The FUSE operations (fusepy calls them by name; paths are absolute in the mount)."""

    use_ns = True  # fusepy: times in nanoseconds

    def __init__(self, root):
        self.root = os.path.realpath(root)
        self.mutex = threading.Lock()  # guards files, fh_ino and opens (not `lock`: a FUSE op's name)
        self.files = {}               # backing inode -> Pending
        self.fh_ino = {}              # open descriptor -> backing inode
        self.opens = {}               # backing inode -> open descriptors
        self.sync_fh = set()          # descriptors opened O_SYNC / O_DSYNC
        self.counts = {"writes": 0, "fsyncs": 0, "drops": 0, "dropped_bytes": 0}

    def __call__(self, op, *args):
        handler = getattr(self, op, None)
        if handler is None:
            raise OSError(errno.ENOSYS, op)
        return handler(*args)

    def _full(self, path):
        return os.path.join(self.root, path.lstrip("/"))

    # ---- held writes --------------------------------------------------------------------

    def _pending(self, ino, fh):
        """The file's Pending, made (with the backing file's length) on its first write."""
        with self.mutex:
            p = self.files.get(ino)
            if p is None:
                p = Pending(os.dup(fh), os.fstat(fh).st_size)
                self.files[ino] = p
            return p

    def _forget(self, ino):
        """A new or deleted inode: nothing held for it any more."""
        with self.mutex:
            p = self.files.pop(ino, None)
        if p is not None:
            with p.lock:
                p.dropped = True
                p.pages.clear()
                os.close(p.fd)

    def _persist(self, p):
        """Writes a file's held pages to its backing file (the caller holds p.lock)."""
        if p.dropped or not p.pages:
            return
        for first, count in _runs(sorted(p.pages)):
            start = first * PAGE
            end = min(start + count * PAGE, p.size)
            if end <= start:
                continue
            data = b"".join(bytes(p.pages[n]) for n in range(first, first + count))
            os.pwrite(p.fd, data[:end - start], start)
        if os.fstat(p.fd).st_size < p.size:
            os.ftruncate(p.fd, p.size)  # a hole written past the end, or a tail of zeros
        p.pages.clear()

    def _cut(self, p, length):
        """A truncate to `length`: held pages past it go, the last one is zeroed past it."""
        p.size = length
        last, within = divmod(length, PAGE)
        for n in [n for n in p.pages if n > last or (n == last and within == 0)]:
            del p.pages[n]
        if within and last in p.pages:
            p.pages[last][within:] = bytes(PAGE - within)

    def drop(self):
        """Power failure: every held write is lost."""
        with self.mutex:
            files, self.files = self.files, {}
        lost = 0
        by_path = {}
        for p in files.values():
            with p.lock:
                if p.pages:
                    lost += p.held_bytes()
                    by_path[p.path] = by_path.get(p.path, 0) + p.held_bytes()
                p.dropped = True
                p.pages.clear()
                os.close(p.fd)
        self.counts["drops"] += 1
        self.counts["dropped_bytes"] += lost
        return {"files": len(by_path), "bytes": lost, "paths": dict(sorted(by_path.items()))}

    def sync_all(self):
        with self.mutex:
            files = list(self.files.values())
        for p in files:
            with p.lock:
                self._persist(p)
        return {"files": len(files)}

    def stats(self):
        with self.mutex:
            files = list(self.files.values())
        held = [p for p in files if p.pages]
        return dict(self.counts, held_files=len(held), held_bytes=sum(p.held_bytes() for p in held))

    # ---- files --------------------------------------------------------------------------

    def _register(self, fd, flags=0):
        ino = os.fstat(fd).st_ino
        with self.mutex:
            self.fh_ino[fd] = ino
            self.opens[ino] = self.opens.get(ino, 0) + 1
        if flags & (os.O_SYNC | os.O_DSYNC):
            self.sync_fh.add(fd)
        return ino

    def open(self, path, flags):
        # Always read-write on the backing file: pages are read back to be modified, and
        # an fsync through a read-only descriptor persists too. The kernel has already
        # applied O_APPEND to the offsets it sends; O_TRUNC is a truncate (persisted).
        fd = os.open(self._full(path), os.O_RDWR | os.O_CLOEXEC)
        self._register(fd, flags)
        if flags & os.O_TRUNC:
            self.truncate(path, 0, fd)
        return fd

    def create(self, path, mode, fi=None):
        full = self._full(path)
        try:
            fd = os.open(full, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
            self._forget(os.fstat(fd).st_ino)  # a reused inode number starts empty
        except FileExistsError:
            fd = os.open(full, os.O_RDWR | os.O_CLOEXEC)
        self._register(fd)
        return fd

    def read(self, path, size, offset, fh):
        with self.mutex:
            p = self.files.get(self.fh_ino[fh])
        if p is None:
            return os.pread(fh, size, offset)
        with p.lock:
            end = min(offset + size, p.size)
            out = bytearray()
            pos = offset
            while pos < end:
                n, within = divmod(pos, PAGE)
                page = p.pages.get(n)
                if page is not None:
                    chunk = min(PAGE - within, end - pos)
                    out += page[within:within + chunk]
                else:
                    # Up to the next held page, from the backing file (zeros past its end).
                    m = n + 1
                    while m * PAGE < end and m not in p.pages:
                        m += 1
                    chunk = min(m * PAGE, end) - pos
                    data = os.pread(fh, chunk, pos)
                    out += data + bytes(chunk - len(data))
                pos += chunk
            return bytes(out)

    def write(self, path, data, offset, fh):
        ino = self.fh_ino[fh]
        while True:
            p = self._pending(ino, fh)
            with p.lock:
                if p.dropped:
                    continue
                pos = 0
                while pos < len(data):
                    n, within = divmod(offset + pos, PAGE)
                    chunk = min(PAGE - within, len(data) - pos)
                    page = p.pages.get(n)
                    if page is None:
                        page = bytearray(PAGE)
                        if n * PAGE < p.size:
                            old = os.pread(fh, min(PAGE, p.size - n * PAGE), n * PAGE)
                            page[:len(old)] = old
                        p.pages[n] = page
                    page[within:within + chunk] = data[pos:pos + chunk]
                    pos += chunk
                p.size = max(p.size, offset + len(data))
                p.path = path
                self.counts["writes"] += 1
                if fh in self.sync_fh:
                    self._persist(p)
                return len(data)

    def fsync(self, path, datasync, fh):
        with self.mutex:
            p = self.files.get(self.fh_ino[fh])
        self.counts["fsyncs"] += 1
        if p is not None:
            with p.lock:
                self._persist(p)
        return 0

    def flush(self, path, fh):
        return 0  # close(2): nothing is persisted (the page cache keeps it)

    def release(self, path, fh):
        with self.mutex:
            ino = self.fh_ino.pop(fh, None)
            left = self.opens.get(ino, 1) - 1
            if left:
                self.opens[ino] = left
            else:
                self.opens.pop(ino, None)
        self.sync_fh.discard(fh)
        gone = os.fstat(fh).st_nlink == 0
        os.close(fh)
        if not left and gone:
            self._forget(ino)
        return 0

    def truncate(self, path, length, fh=None):
        fh = fh if isinstance(fh, int) else None
        if fh is not None:
            ino = os.fstat(fh).st_ino
        else:
            ino = os.lstat(self._full(path)).st_ino
        with self.mutex:
            p = self.files.get(ino)
        if p is None:
            if fh is not None:
                os.ftruncate(fh, length)
            else:
                os.truncate(self._full(path), length)
            return 0
        with p.lock:
            os.ftruncate(p.fd, length)
            self._cut(p, length)
        return 0

    def getattr(self, path, fh=None):
        st = os.fstat(fh) if isinstance(fh, int) else os.lstat(self._full(path))
        attrs = {key: getattr(st, key) for key in ("st_mode", "st_ino", "st_nlink", "st_uid", "st_gid", "st_size",
                                                   "st_blocks", "st_blksize", "st_rdev")}
        attrs.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
        if stat.S_ISREG(st.st_mode):
            with self.mutex:
                p = self.files.get(st.st_ino)
            if p is not None:
                attrs["st_size"] = p.size
                attrs["st_blocks"] = max(st.st_blocks, (p.size + 511) // 512)
        return attrs

    # ---- metadata: passed through (persisted at once) -----------------------------------

    def _unlinked(self, st):
        """After an unlink or a rename over it: forget the inode if nothing keeps it."""
        if st is not None and stat.S_ISREG(st.st_mode) and st.st_nlink <= 1:
            with self.mutex:
                still_open = st.st_ino in self.opens
            if not still_open:
                self._forget(st.st_ino)

    def unlink(self, path):
        full = self._full(path)
        st = os.lstat(full)
        os.unlink(full)
        self._unlinked(st)

    def rename(self, old, new):
        target = self._full(new)
        try:
            st = os.lstat(target)
        except FileNotFoundError:
            st = None
        if st is not None and st.st_ino == os.lstat(self._full(old)).st_ino:
            st = None
        os.rename(self._full(old), target)
        self._unlinked(st)

    def mkdir(self, path, mode):
        os.mkdir(self._full(path), mode)

    def rmdir(self, path):
        os.rmdir(self._full(path))

    def mknod(self, path, mode, dev):
        os.mknod(self._full(path), mode, dev)

    def symlink(self, target, source):
        os.symlink(source, self._full(target))

    def link(self, target, source):
        os.link(self._full(source), self._full(target))

    def readlink(self, path):
        return os.readlink(self._full(path))

    def readdir(self, path, fh):
        return [".", ".."] + os.listdir(self._full(path))

    def chmod(self, path, mode):
        os.chmod(self._full(path), mode)

    def chown(self, path, uid, gid):
        os.chown(self._full(path), uid, gid)

    def utimens(self, path, times=None):
        if times:
            os.utime(self._full(path), ns=times)
        else:
            os.utime(self._full(path))

    def access(self, path, amode):
        if not os.access(self._full(path), amode):
            raise OSError(errno.EACCES, path)

    def statfs(self, path):
        sv = os.statvfs(self._full(path))
        return {key: getattr(sv, key) for key in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree",
                                                  "f_files", "f_flag", "f_frsize", "f_namemax")}

    def fsyncdir(self, path, datasync, fh):
        return 0  # directory operations are persisted as they happen

    def opendir(self, path):
        return 0

    def releasedir(self, path, fh):
        return 0

    def init(self, path):
        return None

    def destroy(self, path):
        self.sync_all()  # unmounted: a clean shutdown writes everything back


def serve_control(fs, name):
    """The control socket: one command line in, one JSON line out, per connection."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind("\0" + name)
    srv.listen(8)

    def loop():
        while True:
            conn, _ = srv.accept()
            with conn:
                try:
                    cmd = conn.makefile("r").readline().strip()
                    if cmd == "drop":
                        out = fs.drop()
                    elif cmd == "sync":
                        out = fs.sync_all()
                    elif cmd == "stats":
                        out = fs.stats()
                    elif cmd == "ping":
                        out = {"ok": True}
                    else:
                        out = {"error": f"unknown command {cmd!r}"}
                except Exception as e:  # noqa: BLE001 - answer, keep serving
                    out = {"error": repr(e)}
                conn.sendall((json.dumps(out) + "\n").encode())

    threading.Thread(target=loop, name="lossyfs-control", daemon=True).start()


def control(name, command, timeout=30):
    """Sends one command to a running lossyfs; returns its JSON answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect("\0" + name)
        s.sendall((command + "\n").encode())
        line = s.makefile("r").readline()
    if not line:
        raise RuntimeError(f"lossyfs {name}: no answer to {command}")
    out = json.loads(line)
    if "error" in out:
        raise RuntimeError(f"lossyfs {name}: {command}: {out['error']}")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("backing")
    ap.add_argument("mountpoint")
    ap.add_argument("--control", required=True, help="abstract Unix socket name for drop/sync/stats")
    a = ap.parse_args(argv)
    from fuse import FUSE  # fusepy; imported here so that control() needs no libfuse
    fs = LossyFS(a.backing)
    serve_control(fs, a.control)
    FUSE(fs, a.mountpoint, foreground=True, nothreads=False, direct_io=True, attr_timeout=0, entry_timeout=0,
         negative_timeout=0, big_writes=True, max_write=131072, fsname="lossyfs", subtype="lossyfs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
