// One run per output directory. Two runs writing the same -o (a second launch by mistake) would
// overwrite each other's checkpoints and logs; so a run holds an exclusive flock(2) on -o/lock for as
// long as it lives, and a second run that cannot get it stops with a message naming the holder.
// The kernel drops a flock when its process ends, however it ends (SIGKILL, OOM kill, power loss of
// the node for a local disk): a killed run never blocks its own resume, and there is no stale lock
// file to delete by hand. The file itself stays; its content (the holder's pid and host) is only
// for the message.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "../utils.h"

inline std::string output_lock_path(const std::string& dir) { return dir + "/lock"; }

// Takes the lock of `dir` (which must exist) or stops the run. Returns the descriptor, which the
// process keeps open until it exits (closing it would release the lock).
inline int output_dir_lock(const std::string& dir) {
    std::string path = output_lock_path(dir);
    int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) fatal("output directory '%s': cannot open the lock file %s: %s", dir.c_str(), path.c_str(), strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int err = errno;
        char holder[256] = {0};
        ssize_t n = pread(fd, holder, sizeof(holder) - 1, 0);
        if (n > 0 && holder[n - 1] == '\n') holder[n - 1] = '\0';
        if (err == EWOULDBLOCK) {
            fatal("output directory '%s' is in use by another run: %s is locked (last taken by %s). Two runs must not "
                  "write the same -o; wait for the other to end, stop it, or choose another -o", dir.c_str(),
                  path.c_str(), n > 0 ? holder : "an unknown process");
        }
        fatal("output directory '%s': cannot lock %s: %s", dir.c_str(), path.c_str(), strerror(err));
    }
    char host[128] = "?";
    gethostname(host, sizeof(host) - 1);
    char text[256];
    int len = snprintf(text, sizeof(text), "pid %d on %s\n", (int)getpid(), host);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, text, len, 0) != len) {
        fatal("output directory '%s': cannot write the lock file %s", dir.c_str(), path.c_str());
    }
    return fd;
}
