"""Removing what an execution left in its scratch directory, whatever shape it gave it.

``shutil.rmtree`` recurses once per directory level (Python 3.11): a chain 1500 directories deep
raises RecursionError in the worker, and the directory stays behind for good. Here the walk is a
loop holding one directory descriptor at a time (it climbs back through ``..``, so neither the
depth nor PATH_MAX matters), symlinks are removed and never followed, and permissions the code took
away are given back before removal. Nothing here raises: cleanup reports what it could not remove.
"""

from __future__ import annotations

import contextlib
import os
import stat

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _entries(fd: int) -> tuple[list[str], list[str]]:
    """(subdirectories, everything else) of the open directory ``fd``."""
    dirs, others = [], []
    with os.scandir(fd) as it:
        for entry in it:
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                is_dir = False
            (dirs if is_dir else others).append(entry.name)
    return dirs, others


def _open_dir(name: str, parent_fd: int) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except PermissionError:  # code removed our search permission
        os.chmod(name, 0o700, dir_fd=parent_fd, follow_symlinks=True)
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)


def empty_directory(parent_fd: int, name: str, *, remove_self: bool = True, close_parent: bool = False) -> int:
    """Remove everything beneath ``name`` (in the directory ``parent_fd``), and ``name`` itself
    with ``remove_self``; returns how many entries could not be removed (0: all gone)."""
    try:
        return _empty(parent_fd, name, remove_self)
    except Exception:  # never raises: a failure is an entry left behind
        return 1
    finally:
        if close_parent:
            os.close(parent_fd)


def _empty(parent_fd: int, name: str, remove_self: bool) -> int:
    failures = 0
    with contextlib.suppress(OSError):
        os.chmod(name, 0o700, dir_fd=parent_fd)
    try:
        fd = _open_dir(name, parent_fd)
    except OSError:
        return 1
    # One frame per level, descriptor-free: the name of the level and its subdirectories still to do.
    stack: list[tuple[str, list[str]]] = []
    current, pending = name, None
    while True:
        if pending is None:
            try:
                pending, others = _entries(fd)
            except OSError:
                pending, others = [], []
                failures += 1
            for other in others:
                try:
                    os.unlink(other, dir_fd=fd)
                except OSError:
                    failures += 1
        if pending:
            sub = pending.pop()
            with contextlib.suppress(OSError):
                os.chmod(sub, 0o700, dir_fd=fd)
            try:
                sub_fd = _open_dir(sub, fd)
            except OSError:
                failures += 1
                continue
            stack.append((current, pending))
            os.close(fd)
            fd, current, pending = sub_fd, sub, None
            continue
        if not stack:  # back at ``name``: everything beneath is done
            os.close(fd)
            break
        try:  # climb: ``..`` of a directory is always its real parent, never a symlink
            parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
        except OSError:
            os.close(fd)
            return failures + 1
        os.close(fd)
        try:
            os.rmdir(current, dir_fd=parent)
        except OSError:
            failures += 1
        fd = parent
        current, pending = stack.pop()
    if remove_self:
        try:
            os.rmdir(name, dir_fd=parent_fd)
        except OSError:
            failures += 1
    return failures


def remove_path(path: str) -> int:
    """Remove ``path`` (a directory tree, a file or a symlink); returns the entries left behind."""
    parent, name = os.path.split(os.path.abspath(path))
    try:  # O_PATH: the parent may be search-only (the replica's scratch root is not listable)
        parent_fd = os.open(parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return 1
    try:
        info = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        if stat.S_ISDIR(info.st_mode):
            return empty_directory(parent_fd, name)
        os.unlink(name, dir_fd=parent_fd)
        return 0
    except FileNotFoundError:
        return 0
    except OSError:
        return 1
    finally:
        os.close(parent_fd)


def open_beneath(directory: str, relative: str) -> int:
    """A descriptor of the regular file or other non-directory ``relative`` (normalised, inside) under
    ``directory``, opened without following a symlink at any component: OSError (ELOOP, ENOTDIR) when one is."""
    parts = relative.split("/")
    fd = os.open(directory, _DIR_FLAGS)
    try:
        for part in parts[:-1]:
            inner = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = inner
        return os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
    finally:
        os.close(fd)
