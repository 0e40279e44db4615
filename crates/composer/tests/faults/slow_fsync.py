"""A passthrough FUSE filesystem whose fsync stalls while a flag file exists.

    python3 slow_fsync.py SOURCE MOUNTPOINT FLAG SECONDS

Every operation goes to SOURCE; an fsync (or fdatasync, or a directory's
fsync) sleeps SECONDS first whenever FLAG exists. The fault scenarios put
PostgreSQL's WAL here to make its commits wait on a disk that stalls.
Files and directories are created as the calling process's user. Needs
fusepy (PyPI) and libfuse2; runs in the foreground until unmounted.
"""

import errno
import os
import sys
import time

from fuse import FUSE, FuseOSError, Operations, fuse_get_context


class SlowFsync(Operations):
    def __init__(self, root, flag, seconds):
        self.root = root
        self.flag = flag
        self.seconds = seconds

    def _path(self, path):
        return os.path.join(self.root, path.lstrip("/"))

    def _owned(self, path):
        uid, gid, _ = fuse_get_context()
        os.lchown(path, uid, gid)

    def _stall(self):
        if os.path.exists(self.flag):
            time.sleep(self.seconds)

    def access(self, path, mode):
        if not os.access(self._path(path), mode):
            raise FuseOSError(errno.EACCES)

    def chmod(self, path, mode):
        os.chmod(self._path(path), mode)

    def chown(self, path, uid, gid):
        os.lchown(self._path(path), uid, gid)

    def getattr(self, path, fh=None):
        st = os.lstat(self._path(path))
        keys = ("st_atime", "st_ctime", "st_gid", "st_mode", "st_mtime", "st_nlink", "st_size", "st_uid")
        return {k: getattr(st, k) for k in keys}

    def readdir(self, path, fh):
        return [".", ".."] + os.listdir(self._path(path))

    def mkdir(self, path, mode):
        os.mkdir(self._path(path), mode)
        self._owned(self._path(path))

    def rmdir(self, path):
        os.rmdir(self._path(path))

    def unlink(self, path):
        os.unlink(self._path(path))

    def rename(self, old, new):
        os.rename(self._path(old), self._path(new))

    def link(self, target, name):
        os.link(self._path(name), self._path(target))

    def utimens(self, path, times=None):
        os.utime(self._path(path), times)

    def statfs(self, path):
        st = os.statvfs(self._path(path))
        keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_flag",
                "f_frsize", "f_namemax")
        return {k: getattr(st, k) for k in keys}

    def open(self, path, flags):
        return os.open(self._path(path), flags)

    def create(self, path, mode, fi=None):
        fd = os.open(self._path(path), os.O_RDWR | os.O_CREAT, mode)
        self._owned(self._path(path))
        return fd

    def read(self, path, size, offset, fh):
        return os.pread(fh, size, offset)

    def write(self, path, data, offset, fh):
        return os.pwrite(fh, data, offset)

    def truncate(self, path, length, fh=None):
        with open(self._path(path), "r+b") as f:
            f.truncate(length)

    def flush(self, path, fh):
        return 0

    def release(self, path, fh):
        os.close(fh)

    def fsync(self, path, datasync, fh):
        self._stall()
        os.fsync(fh)
        return 0

    def fsyncdir(self, path, datasync, fh):
        self._stall()
        return 0


if __name__ == "__main__":
    source, mountpoint, flag, seconds = sys.argv[1:5]
    FUSE(SlowFsync(source, flag, float(seconds)), mountpoint, foreground=True, allow_other=True, nothreads=False)
