// Bootstrap of a multi-process GPU run: how the processes find each other before NCCL exists.
//
// NCCL forms a communicator from an ncclUniqueId, an opaque 128-byte value that rank 0 creates and
// every other rank must receive by some other means. Under mpirun that is an MPI broadcast (in
// llmc/parallel/gpu_start.cuh). Without MPI, this header moves such an opaque blob from rank 0 to the others in one
// of two ways, and never waits without a deadline:
//
//   TCP  (-pi tcp -ps HOST:PORT): rank 0 listens on HOST:PORT. Every other rank connects, retrying
//        while rank 0 is not up yet, and sends a hello (magic, its rank, the process count, the blob
//        size). Once all N-1 hellos are in, rank 0 answers each with the blob, so the exchange is also a
//        barrier: when it returns, all N processes are alive. When rank 0 gives up (a rank missing at
//        the deadline, two processes with one rank, another process count) it answers everyone who
//        is connected with the reason, so every process stops with the same message.
//   file (-pi file -pf PATH): rank 0 writes the blob to PATH on a file system all nodes share, under
//        a temporary name renamed into place (llmc/utils.h AtomicFile), so a reader sees all of it or
//        nothing; the others poll until it appears. Rank 0 refuses a PATH that already exists (an
//        earlier run's id would send the others to a dead rank 0), and removes it once the
//        communicator is formed (bootstrap_file_remove). Give every run its own PATH.
//
// Wire format (little-endian, all fields 32-bit):
//   hello  rank r -> rank 0:  magic, version, rank, num_processes, blob_size, 0
//   reply  rank 0 -> rank r:  magic, status (0 ok, 1 error), length, 0; then `length` bytes: the blob,
//                             or the error message
//   file:                     magic, version, num_processes, blob_size; then the blob
// Every field is checked, so a stray client, another service on the port, a file of another kind or a
// process started with other flags is reported, not trusted.
//
// The functions return false with a message instead of exiting, so the tests can run every rank as a
// thread of one process (test/test_bootstrap.cpp); the trainer turns a false into a fatal error.
// Also here: the choice of method from the flags and the environment, and which GPU a rank uses.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "../utils.h"

constexpr uint32_t BOOTSTRAP_TCP_MAGIC = 20261201;
constexpr uint32_t BOOTSTRAP_FILE_MAGIC = 20261202;
constexpr uint32_t BOOTSTRAP_VERSION = 1;
constexpr uint32_t BOOTSTRAP_MAX_ERROR_BYTES = 4096;
constexpr int BOOTSTRAP_REPLY_GRACE_S = 3;  // how much longer than -pt a connected rank waits for rank 0's answer

// ----------------------------------------------------------------------------
// deadlines and messages

using BootstrapClock = std::chrono::steady_clock;

inline BootstrapClock::time_point deadline_after(double seconds) {
    return BootstrapClock::now() + std::chrono::microseconds((int64_t)(seconds * 1e6));
}

// Milliseconds left until the deadline, at least 0 (for poll()).
inline int ms_until(BootstrapClock::time_point deadline) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - BootstrapClock::now()).count();
    return (int)std::max<int64_t>(0, std::min<int64_t>(left, 1 << 30));
}

__attribute__((format(printf, 2, 3))) inline bool bootstrap_fail(std::string* error, const char* fmt, ...) {
    char text[2048];
    va_list args;
    va_start(args, fmt);
    vsnprintf(text, sizeof(text), fmt, args);
    va_end(args);
    if (error) *error = text;
    return false;
}

// "HOST:PORT" -> host, port. HOST is a name or an IPv4 address; an IPv6 address goes in brackets,
// "[::1]:29500".
inline bool parse_host_port(const std::string& text, std::string* host, int* port, std::string* error) {
    size_t colon = text.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) {
        return bootstrap_fail(error, "'%s' is not HOST:PORT (e.g. node001:29500 or 10.0.0.1:29500)", text.c_str());
    }
    std::string h = text.substr(0, colon), p = text.substr(colon + 1);
    if (h.front() == '[') {
        if (h.size() < 3 || h.back() != ']') return bootstrap_fail(error, "'%s': unbalanced brackets", text.c_str());
        h = h.substr(1, h.size() - 2);
    }
    char* end = nullptr;
    long value = strtol(p.c_str(), &end, 10);
    if (*end != '\0' || value < 1 || value > 65535) {
        return bootstrap_fail(error, "'%s': port '%s' is not a number in 1..65535", text.c_str(), p.c_str());
    }
    *host = h;
    *port = (int)value;
    return true;
}

// ----------------------------------------------------------------------------
// sockets with deadlines

struct AddressList {
    addrinfo* head = nullptr;
    ~AddressList() { if (head) freeaddrinfo(head); }
};

inline bool resolve(const std::string& host, int port, bool passive, AddressList* out, std::string* error) {
    addrinfo hints;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = passive ? AI_PASSIVE : 0;
    std::string service = std::to_string(port);
    int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &out->head);
    if (rc != 0) return bootstrap_fail(error, "cannot resolve '%s': %s", host.c_str(), gai_strerror(rc));
    return true;
}

inline std::string address_text(const sockaddr* addr) {
    char text[INET6_ADDRSTRLEN] = "?";
    if (addr->sa_family == AF_INET) inet_ntop(AF_INET, &((const sockaddr_in*)addr)->sin_addr, text, sizeof(text));
    if (addr->sa_family == AF_INET6) inet_ntop(AF_INET6, &((const sockaddr_in6*)addr)->sin6_addr, text, sizeof(text));
    return text;
}

inline bool is_loopback(const sockaddr* addr) {
    if (addr->sa_family == AF_INET) return (ntohl(((const sockaddr_in*)addr)->sin_addr.s_addr) >> 24) == 127;
    if (addr->sa_family == AF_INET6) return IN6_IS_ADDR_LOOPBACK(&((const sockaddr_in6*)addr)->sin6_addr);
    return false;
}

inline void set_nonblocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL, 0) | O_NONBLOCK); }

// Sends all `size` bytes before the deadline (the socket is non-blocking). MSG_NOSIGNAL: a peer that
// has gone away is an error here, not a SIGPIPE that kills the process.
inline bool send_all(int fd, const void* data, size_t size, BootstrapClock::time_point deadline, std::string* error) {
    const char* p = (const char*)data;
    while (size > 0) {
        ssize_t n = send(fd, p, size, MSG_NOSIGNAL);
        if (n > 0) {
            p += n;
            size -= (size_t)n;
            continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            return bootstrap_fail(error, "send failed: %s", strerror(errno));
        }
        pollfd pfd = {fd, POLLOUT, 0};
        if (poll(&pfd, 1, ms_until(deadline)) == 0) return bootstrap_fail(error, "send timed out");
    }
    return true;
}

// Receives exactly `size` bytes before the deadline. A peer that closes early is an error.
inline bool recv_all(int fd, void* data, size_t size, BootstrapClock::time_point deadline, std::string* error) {
    char* p = (char*)data;
    while (size > 0) {
        ssize_t n = recv(fd, p, size, 0);
        if (n > 0) {
            p += n;
            size -= (size_t)n;
            continue;
        }
        if (n == 0) return bootstrap_fail(error, "the connection was closed by the other side");
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            return bootstrap_fail(error, "receive failed: %s", strerror(errno));
        }
        pollfd pfd = {fd, POLLIN, 0};
        if (ms_until(deadline) == 0 || poll(&pfd, 1, ms_until(deadline)) == 0) {
            return bootstrap_fail(error, "nothing received before the deadline");
        }
    }
    return true;
}

struct BootstrapHello {
    uint32_t magic, version;
    int32_t rank, num_processes;
    uint32_t blob_size, reserved;
};
struct BootstrapReply {
    uint32_t magic, status, length, reserved;
};
static_assert(sizeof(BootstrapHello) == 24 && sizeof(BootstrapReply) == 16, "wire structs must not be padded");

// ----------------------------------------------------------------------------
// TCP: rank 0

// One connection to rank 0 while it waits for everyone's hello.
struct BootstrapPeer {
    int fd = -1;
    std::string address;
    BootstrapHello hello;
    size_t received = 0;  // bytes of hello so far
    int rank = -1;        // set once a valid hello is in
};

inline void reply_to(BootstrapPeer* peer, uint32_t status, const void* payload, uint32_t length,
                     BootstrapClock::time_point deadline) {
    BootstrapReply reply = {BOOTSTRAP_TCP_MAGIC, status, length, 0};
    std::string ignored;
    if (send_all(peer->fd, &reply, sizeof(reply), deadline, &ignored)) send_all(peer->fd, payload, length, deadline, &ignored);
    shutdown(peer->fd, SHUT_WR);
}

// Rank 0's side: gives up with `message`, telling every connected process why.
inline bool server_fail(std::vector<BootstrapPeer>* peers, const std::string& message, std::string* error) {
    // a short grace period: these processes are connected and waiting, and the message is small
    BootstrapClock::time_point grace = deadline_after(2.0);
    std::string text = "rank 0 ended the bootstrap: " + message;
    for (BootstrapPeer& peer : *peers) {
        if (peer.rank >= 0) reply_to(&peer, 1, text.data(), (uint32_t)text.size(), grace);
    }
    *error = message;
    return false;
}

inline bool bootstrap_tcp_serve(const std::string& host, int port, int num_processes, double timeout_s,
                                const uint8_t* blob, size_t blob_size, std::string* error) {
    BootstrapClock::time_point deadline = deadline_after(timeout_s);
    AddressList addresses;
    if (!resolve(host, port, true, &addresses, error)) return false;
    int listen_fd = -1;
    std::string bind_error = "no address";
    for (addrinfo* a = addresses.head; a != nullptr && listen_fd < 0; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // a restart need not wait out TIME_WAIT
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, std::max(16, num_processes)) == 0) {
            listen_fd = fd;
            if (is_loopback(a->ai_addr) && num_processes > 1) {
                fprintf(stderr, "bootstrap: rank 0 listens on %s, a loopback address: fine on one node, but "
                        "processes on other nodes cannot reach it\n", address_text(a->ai_addr).c_str());
            }
        } else {
            bind_error = strerror(errno);
            close(fd);
        }
    }
    if (listen_fd < 0) {
        return bootstrap_fail(error, "rank 0 cannot listen on %s:%d: %s (is the port taken, or is %s not an address "
                              "of this node?)", host.c_str(), port, bind_error.c_str(), host.c_str());
    }
    set_nonblocking(listen_fd);

    std::vector<BootstrapPeer> peers;
    std::vector<int> rank_peer(num_processes, -1);  // index into peers of each checked-in rank
    int checked_in = 0;
    std::string ignored;  // what the last stray connection was, for the timeout message
    while (checked_in < num_processes - 1) {
        std::vector<pollfd> fds = {{listen_fd, POLLIN, 0}};
        std::vector<size_t> which;
        for (size_t i = 0; i < peers.size(); i++) {
            if (peers[i].fd >= 0 && peers[i].rank < 0) {
                fds.push_back({peers[i].fd, POLLIN, 0});
                which.push_back(i);
            }
        }
        int ready = poll(fds.data(), fds.size(), ms_until(deadline));
        if (ready == 0 || ms_until(deadline) == 0) {
            std::string missing;
            for (int r = 1; r < num_processes; r++) {
                if (rank_peer[r] < 0) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
            }
            char why[1024];
            snprintf(why, sizeof(why), "only %d of the %d other ranks connected to %s:%d within %g s (-pt); missing "
                     "rank(s): %s%s%s", checked_in, num_processes - 1, host.c_str(), port, timeout_s, missing.c_str(),
                     ignored.empty() ? "" : "; ", ignored.c_str());
            close(listen_fd);
            bool result = server_fail(&peers, why, error);
            for (BootstrapPeer& peer : peers) if (peer.fd >= 0) close(peer.fd);
            return result;
        }
        if (ready < 0) continue;  // EINTR
        if (fds[0].revents & POLLIN) {
            sockaddr_storage from;
            socklen_t from_size = sizeof(from);
            int fd = accept(listen_fd, (sockaddr*)&from, &from_size);
            if (fd >= 0) {
                set_nonblocking(fd);
                BootstrapPeer peer;
                peer.fd = fd;
                peer.address = address_text((sockaddr*)&from);
                peers.push_back(peer);
            }
        }
        for (size_t k = 1; k < fds.size(); k++) {
            if (fds[k].revents == 0) continue;
            BootstrapPeer& peer = peers[which[k - 1]];
            ssize_t n = recv(peer.fd, (char*)&peer.hello + peer.received, sizeof(BootstrapHello) - peer.received, 0);
            if (n <= 0) {
                if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
                close(peer.fd);  // gone before its hello was complete: not one of ours, or it died; forget it
                peer.fd = -1;
                continue;
            }
            peer.received += (size_t)n;
            if (peer.received < sizeof(BootstrapHello)) continue;
            const BootstrapHello& h = peer.hello;
            if (h.magic != BOOTSTRAP_TCP_MAGIC || h.version != BOOTSTRAP_VERSION) {
                // a port scanner or another program: not a reason to stop the run
                ignored = "ignored a connection from " + peer.address + " that did not speak this protocol";
                fprintf(stderr, "bootstrap: %s\n", ignored.c_str());
                close(peer.fd);
                peer.fd = -1;
                continue;
            }
            char why[512] = "";
            if (h.num_processes != num_processes) {
                snprintf(why, sizeof(why), "rank %d (%s) was started with %d processes (-pn), rank 0 with %d",
                         h.rank, peer.address.c_str(), h.num_processes, num_processes);
            } else if (h.blob_size != blob_size) {
                snprintf(why, sizeof(why), "rank %d (%s) expects a %u-byte id, rank 0 has %zu (another build?)",
                         h.rank, peer.address.c_str(), h.blob_size, blob_size);
            } else if (h.rank < 1 || h.rank >= num_processes) {
                snprintf(why, sizeof(why), "a process at %s claims rank %d, outside 1..%d", peer.address.c_str(),
                         h.rank, num_processes - 1);
            } else if (rank_peer[h.rank] >= 0) {
                snprintf(why, sizeof(why), "two processes claim rank %d (%s and %s): check -pr",
                         h.rank, peers[rank_peer[h.rank]].address.c_str(), peer.address.c_str());
            }
            peer.rank = std::max(0, (int)h.rank);  // connected and waiting: it will hear the outcome
            if (why[0] != '\0') {
                close(listen_fd);
                bool result = server_fail(&peers, why, error);
                for (BootstrapPeer& p : peers) if (p.fd >= 0) close(p.fd);
                return result;
            }
            rank_peer[h.rank] = (int)which[k - 1];
            checked_in++;
        }
    }
    close(listen_fd);
    // everyone is here: the blob to each (a grace period past the deadline; they are all waiting)
    BootstrapClock::time_point send_deadline = std::max(deadline, deadline_after(5.0));
    bool ok = true;
    for (int r = 1; r < num_processes; r++) {
        BootstrapPeer& peer = peers[rank_peer[r]];
        BootstrapReply reply = {BOOTSTRAP_TCP_MAGIC, 0, (uint32_t)blob_size, 0};
        std::string send_error;
        if (!send_all(peer.fd, &reply, sizeof(reply), send_deadline, &send_error) ||
            !send_all(peer.fd, blob, blob_size, send_deadline, &send_error)) {
            ok = bootstrap_fail(error, "rank 0 could not send the id to rank %d (%s): %s", r, peer.address.c_str(),
                                send_error.c_str());
        }
        shutdown(peer.fd, SHUT_WR);
    }
    for (BootstrapPeer& peer : peers) if (peer.fd >= 0) close(peer.fd);
    return ok;
}

// ----------------------------------------------------------------------------
// TCP: the other ranks

// Connects to host:port, retrying until the deadline while nobody listens there yet.
inline int connect_with_retries(const std::string& host, int port, BootstrapClock::time_point deadline,
                                std::string* last_problem) {
    *last_problem = "no attempt";
    while (true) {
        AddressList addresses;
        if (!resolve(host, port, false, &addresses, last_problem)) {
            // names can appear late (DNS of a fresh allocation): retry like a refused connection
        } else {
            for (addrinfo* a = addresses.head; a != nullptr; a = a->ai_next) {
                int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
                if (fd < 0) continue;
                set_nonblocking(fd);
                int rc = connect(fd, a->ai_addr, a->ai_addrlen);
                if (rc < 0 && errno == EINPROGRESS) {
                    pollfd pfd = {fd, POLLOUT, 0};
                    // a silent network (no RST) would keep a connect pending: give each try at most 2 s
                    if (poll(&pfd, 1, std::min(ms_until(deadline), 2000)) == 1) {
                        int so_error = 0;
                        socklen_t len = sizeof(so_error);
                        getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len);
                        rc = so_error == 0 ? 0 : -1;
                        errno = so_error;
                    } else {
                        errno = ETIMEDOUT;
                    }
                }
                if (rc == 0) return fd;
                *last_problem = std::string("connecting to ") + address_text(a->ai_addr) + ": " + strerror(errno);
                close(fd);
            }
        }
        int left = ms_until(deadline);
        if (left == 0) return -1;
        std::this_thread::sleep_for(std::chrono::milliseconds(std::min(left, 200)));
    }
}

inline bool bootstrap_tcp_join(const std::string& host, int port, int rank, int num_processes, double timeout_s,
                               uint8_t* blob, size_t blob_size, std::string* error) {
    BootstrapClock::time_point deadline = deadline_after(timeout_s);
    std::string where = host + ":" + std::to_string(port);
    std::string problem;
    int fd = connect_with_retries(host, port, deadline, &problem);
    if (fd < 0) {
        return bootstrap_fail(error, "rank %d could not reach rank 0 at %s within %g s (-pt); last attempt: %s. Is "
                              "rank 0 running, and is %s the address of its node?", rank, where.c_str(), timeout_s,
                              problem.c_str(), host.c_str());
    }
    BootstrapHello hello = {BOOTSTRAP_TCP_MAGIC, BOOTSTRAP_VERSION, rank, num_processes, (uint32_t)blob_size, 0};
    BootstrapReply reply;
    // rank 0 answers at its own deadline at the latest, which can be a little after ours (it started
    // later): wait a grace period longer, so that its reason for giving up reaches us
    BootstrapClock::time_point reply_deadline = deadline + std::chrono::seconds(BOOTSTRAP_REPLY_GRACE_S);
    bool ok = send_all(fd, &hello, sizeof(hello), deadline, &problem) &&
              recv_all(fd, &reply, sizeof(reply), reply_deadline, &problem);
    if (!ok) {
        close(fd);
        return bootstrap_fail(error, "rank %d: no answer from rank 0 at %s within %g s (-pt, plus %d s): %s", rank,
                              where.c_str(), timeout_s, BOOTSTRAP_REPLY_GRACE_S, problem.c_str());
    }
    if (reply.magic != BOOTSTRAP_TCP_MAGIC) {
        close(fd);
        return bootstrap_fail(error, "rank %d: %s answered with magic %u, not %u: another program listens on that "
                              "port, not rank 0 of this run", rank, where.c_str(), reply.magic, BOOTSTRAP_TCP_MAGIC);
    }
    if (reply.status != 0) {
        std::string message(std::min(reply.length, BOOTSTRAP_MAX_ERROR_BYTES), '\0');
        if (!recv_all(fd, &message[0], message.size(), deadline_after(2.0), &problem)) message = "(message lost)";
        close(fd);
        return bootstrap_fail(error, "%s", message.c_str());
    }
    if (reply.length != blob_size) {
        close(fd);
        return bootstrap_fail(error, "rank %d: rank 0 at %s sent a %u-byte id, expected %zu (another build?)", rank,
                              where.c_str(), reply.length, blob_size);
    }
    ok = recv_all(fd, blob, blob_size, deadline_after(std::max(2.0, ms_until(deadline) / 1000.0)), &problem);
    close(fd);
    if (!ok) return bootstrap_fail(error, "rank %d: the id from rank 0 at %s was cut short: %s", rank, where.c_str(), problem.c_str());
    return true;
}

// The TCP exchange: rank 0 sends blob[blob_size] to every other rank, which receives it into blob.
inline bool bootstrap_tcp(const std::string& host_port, int rank, int num_processes, double timeout_s, uint8_t* blob,
                          size_t blob_size, std::string* error) {
    std::string host;
    int port;
    if (!parse_host_port(host_port, &host, &port, error)) return false;
    if (num_processes == 1) return true;
    if (rank == 0) return bootstrap_tcp_serve(host, port, num_processes, timeout_s, blob, blob_size, error);
    return bootstrap_tcp_join(host, port, rank, num_processes, timeout_s, blob, blob_size, error);
}

// ----------------------------------------------------------------------------
// shared file

inline bool bootstrap_file(const std::string& path, int rank, int num_processes, double timeout_s, uint8_t* blob,
                           size_t blob_size, std::string* error) {
    uint32_t header[4] = {BOOTSTRAP_FILE_MAGIC, BOOTSTRAP_VERSION, (uint32_t)num_processes, (uint32_t)blob_size};
    if (rank == 0) {
        if (file_exists(path)) {
            return bootstrap_fail(error, "the bootstrap file '%s' already exists, left by an earlier run? Its id would "
                                  "lead the other ranks to a rank 0 that is gone. Remove it, or give each run its own "
                                  "path (-pf, e.g. with $SLURM_JOB_ID in it)", path.c_str());
        }
        AtomicFile f = atomic_open(path);
        atomic_write(&f, header, sizeof(header));
        atomic_write(&f, blob, blob_size);
        atomic_commit(&f);
        return true;
    }
    BootstrapClock::time_point deadline = deadline_after(timeout_s);
    long expected = (long)(sizeof(header) + blob_size);
    std::string last = "it does not exist";
    while (true) {
        FILE* fp = fopen(path.c_str(), "rb");
        if (fp != nullptr) {
            long size = file_size_of(fp);
            uint32_t got[4] = {0, 0, 0, 0};
            bool read = size == expected && fread(got, sizeof(got), 1, fp) == 1 && fread(blob, 1, blob_size, fp) == blob_size;
            fclose(fp);
            if (size > expected) {
                return bootstrap_fail(error, "the bootstrap file '%s' is %ld bytes, expected %ld (not written by rank 0 "
                                      "of this program?)", path.c_str(), size, expected);
            }
            if (read) {
                if (got[0] != BOOTSTRAP_FILE_MAGIC || got[1] != BOOTSTRAP_VERSION) {
                    return bootstrap_fail(error, "'%s' is not a bootstrap file of this program (magic %u, version %u; "
                                          "expected %u, %u)", path.c_str(), got[0], got[1], BOOTSTRAP_FILE_MAGIC,
                                          BOOTSTRAP_VERSION);
                }
                if (got[2] != (uint32_t)num_processes) {
                    return bootstrap_fail(error, "rank 0 wrote '%s' for %u processes, this process was started with %d "
                                          "(-pn)", path.c_str(), got[2], num_processes);
                }
                if (got[3] != (uint32_t)blob_size) {
                    return bootstrap_fail(error, "'%s' holds a %u-byte id, expected %zu (another build?)", path.c_str(),
                                          got[3], blob_size);
                }
                return true;
            }
            // shorter than a whole file: a rename is atomic, but a network file system may show it late
            last = "it is " + std::to_string(size) + " bytes, expected " + std::to_string(expected);
        }
        int left = ms_until(deadline);
        if (left == 0) {
            return bootstrap_fail(error, "rank %d: no bootstrap file from rank 0 at '%s' within %g s (-pt; %s). Is rank 0 "
                                  "running, and is this path on a file system all nodes share?", rank, path.c_str(),
                                  timeout_s, last.c_str());
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(std::min(left, 50)));
    }
}

// Rank 0, once the communicator is formed (so every rank has read the file): the next run may reuse the path.
inline void bootstrap_file_remove(const std::string& path) { remove(path.c_str()); }

// ----------------------------------------------------------------------------
// which method, which rank, which GPU

// Set by MPI launchers in every process they start: Open MPI's mpirun, MPICH's Hydra (and Slurm's PMI),
// PMIx (Open MPI 5, srun --mpi=pmix).
inline bool launched_by_mpi(int* size_out = nullptr) {
    const char* vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"};
    for (const char* var : vars) {
        const char* value = getenv(var);
        if (value != nullptr && value[0] != '\0') {
            if (size_out) *size_out = strcmp(var, "PMIX_RANK") == 0 ? -1 : atoi(value);
            return true;
        }
    }
    return false;
}

enum class LaunchMethod { Single, Mpi, Tcp, File };

// What a process needs to know to find the others: the -p* flags (TrainArgs::launch in llmc/run/args.h).
struct LaunchSettings {
    std::string init_method = "auto";  // auto|mpi|tcp|file
    std::string server_address;        // HOST:PORT where rank 0 listens (tcp)
    std::string bootstrap_file;        // a path on a file system all nodes share (file)
    int num_processes = 1;
    int process_rank = 0;
    int gpus_per_node = 0;             // 0: every GPU this process sees
    float timeout_s = 300.0f;          // seconds any process waits for the others
};

inline const char* launch_method_name(LaunchMethod m) {
    switch (m) {
        case LaunchMethod::Single: return "single process";
        case LaunchMethod::Mpi: return "mpi";
        case LaunchMethod::Tcp: return "tcp";
        case LaunchMethod::File: return "file";
    }
    return "?";
}

// The method -pi names, with "auto" resolved: MPI when an MPI launcher started this process, else one
// process without NCCL. Checks that the flags the method needs are there and agree. `with_mpi`: this
// build has MPI.
inline bool choose_launch_method(const LaunchSettings& args, bool with_mpi, LaunchMethod* method, std::string* error) {
    const std::string& pi = args.init_method;
    int mpi_size = 0;
    if (pi == "auto") {
        bool under_mpi = launched_by_mpi(&mpi_size);
        if (under_mpi && !with_mpi && mpi_size != 1) {
            return bootstrap_fail(error, "started by an MPI launcher, but this train_gpt2cu was built without MPI: "
                                  "rebuild where mpicxx is installed, or start the processes with -pi tcp or -pi file");
        }
        *method = under_mpi && with_mpi ? LaunchMethod::Mpi : LaunchMethod::Single;
        if (*method == LaunchMethod::Single && args.num_processes > 1) {
            return bootstrap_fail(error, "flag -pn %d needs -pi tcp or -pi file (or mpirun, which sets the process "
                                  "count itself)", args.num_processes);
        }
        return true;
    }
    if (pi == "mpi") {
        if (!with_mpi) return bootstrap_fail(error, "flag -pi mpi: this train_gpt2cu was built without MPI (no mpicxx at build time)");
        *method = LaunchMethod::Mpi;
        return true;
    }
    if (pi == "tcp" || pi == "file") {
        *method = pi == "tcp" ? LaunchMethod::Tcp : LaunchMethod::File;
        if (pi == "tcp" && args.server_address.empty()) return bootstrap_fail(error, "flag -pi tcp needs -ps HOST:PORT (rank 0's node)");
        if (pi == "file" && args.bootstrap_file.empty()) return bootstrap_fail(error, "flag -pi file needs -pf PATH on a shared file system");
        if (args.process_rank >= args.num_processes) {
            return bootstrap_fail(error, "flag -pr: rank %d is not below the process count -pn %d", args.process_rank,
                                  args.num_processes);
        }
        if (pi == "tcp") {
            std::string host;
            int port;
            if (!parse_host_port(args.server_address, &host, &port, error)) return bootstrap_fail(error, "flag -ps: %s", error->c_str());
        }
        return true;
    }
    return bootstrap_fail(error, "flag -pi: unknown method '%s' (auto, mpi, tcp or file)", pi.c_str());
}

// The GPU of a process started without MPI: its rank modulo the GPUs per node (-pg; 0 = all the
// GPUs this process sees), so ranks must be placed node by node (rank r on node r / gpus_per_node).
// A process that sees one GPU (CUDA_VISIBLE_DEVICES set per process, e.g. srun --gpus-per-task=1)
// uses that one whatever its rank.
inline bool choose_device(int rank, int gpus_per_node, int visible_devices, int* device, std::string* error) {
    if (visible_devices < 1) return bootstrap_fail(error, "no CUDA GPU is visible to rank %d", rank);
    int per_node = gpus_per_node > 0 ? gpus_per_node : visible_devices;
    *device = rank % per_node;
    if (*device >= visible_devices) {
        return bootstrap_fail(error, "rank %d wants GPU %d (rank %% %d GPUs per node, -pg) but sees only %d", rank,
                              *device, per_node, visible_devices);
    }
    return true;
}
