/*
 * The containment battery's attacker (tests/containment/): the few things a
 * hostile command needs that the guest's busybox cannot do. The battery
 * builds it with the system C compiler (`cc -static`, as the kernel builds
 * already need one) into target/containment/, where the guest sees it
 * through the workspace; being static, it runs on the busybox guest and on
 * the test host alike.
 *
 *   attacker id                  print real and effective uid/gid
 *   attacker inet ADDR PORT      TCP connect to an IPv4 or IPv6 address
 *   attacker listen PORT         accept TCP connections on 127.0.0.1:PORT,
 *                                one "accepted" line each, forever
 *   attacker vsock CID PORT      vsock stream connect
 *   attacker eat                 allocate and touch memory until killed
 *   attacker reboot              reboot(2) with RB_AUTOBOOT, no init involved
 *   attacker port VALUE [enable] write VALUE as the exit status to the VMM's
 *                                status port (0x444), with `enable` first
 *                                asking for the port with ioperm(2)
 *   attacker hijack MODE         take the guest agent's vsock connection to
 *                                the host out of the agent (pidfd_getfd, as
 *                                a guest root that owns the guest could):
 *                                PID 1 for mvm run, or in a sandbox the
 *                                agent's process for this command, an
 *                                ancestor of ours; freeze that process
 *                                (ptrace), and write MODE's bytes to the
 *                                host on it
 *   attacker memory DIR          every way a guest root could reach guest
 *                                memory (and so the virtio rings) behind its
 *                                kernel's back: /dev/mem and /dev/kmem (the
 *                                nodes, and ones made with mknod in DIR),
 *                                /dev/port, /proc/kcore, a kernel module,
 *                                kexec; one "NAME: opened|refused (why)"
 *                                line each, then, as the control, a node
 *                                made the same way for /dev/zero, read
 *
 * Each prints one line saying what happened, so that a test can tell "the
 * attack was refused" from "the attack never ran".
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/vm_sockets.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/io.h>
#include <sys/ptrace.h>
#include <sys/reboot.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

static int usage(void)
{
    fprintf(stderr, "usage: attacker id | inet ADDR PORT | listen PORT | "
                    "vsock CID PORT | eat | reboot | port VALUE [enable] | hijack MODE | "
                    "memory DIR\n");
    return 2;
}

static int cmd_id(void)
{
    printf("uid=%d euid=%d gid=%d egid=%d\n", (int)getuid(), (int)geteuid(),
           (int)getgid(), (int)getegid());
    return 0;
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A TCP connect to an IPv4 or IPv6 address; a failure says how long the
 * connect took, so that "refused at once" can be told from "timed out". */
static int cmd_inet(const char *addr, const char *port)
{
    struct sockaddr_storage ss = {0};
    socklen_t len;
    int family;
    uint16_t p = htons((uint16_t)atoi(port));
    if (strchr(addr, ':')) {
        struct sockaddr_in6 *sa = (struct sockaddr_in6 *)&ss;
        sa->sin6_family = family = AF_INET6;
        sa->sin6_port = p;
        if (inet_pton(AF_INET6, addr, &sa->sin6_addr) != 1)
            return usage();
        len = sizeof *sa;
    } else {
        struct sockaddr_in *sa = (struct sockaddr_in *)&ss;
        sa->sin_family = family = AF_INET;
        sa->sin_port = p;
        if (inet_pton(AF_INET, addr, &sa->sin_addr) != 1)
            return usage();
        len = sizeof *sa;
    }
    int s = socket(family, SOCK_STREAM, 0);
    if (s < 0) {
        printf("inet %s:%s: socket: %s\n", addr, port, strerror(errno));
        return 1;
    }
    long long start = now_ms();
    if (connect(s, (struct sockaddr *)&ss, len) < 0) {
        int e = errno;
        printf("inet %s:%s: connect: %s (%lld ms)\n", addr, port, strerror(e),
               now_ms() - start);
        return 1;
    }
    printf("inet %s:%s: connected\n", addr, port);
    return 0;
}

static int cmd_listen(const char *port)
{
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)atoi(port)),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int one = 1;
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0 || setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
        bind(s, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(s, 16) < 0) {
        printf("listen %s: %s\n", port, strerror(errno));
        return 1;
    }
    printf("listening\n");
    fflush(stdout);
    for (;;) {
        int c = accept(s, NULL, NULL);
        if (c < 0)
            continue;
        printf("accepted\n");
        fflush(stdout);
        close(c);
    }
}

static int cmd_vsock(const char *cid, const char *port)
{
    struct sockaddr_vm sa = {.svm_family = AF_VSOCK,
                             .svm_cid = (unsigned)atoi(cid),
                             .svm_port = (unsigned)atoi(port)};
    int s = socket(AF_VSOCK, SOCK_STREAM, 0);
    if (s < 0) {
        printf("vsock %s:%s: socket: %s\n", cid, port, strerror(errno));
        return 1;
    }
    if (connect(s, (struct sockaddr *)&sa, sizeof sa) < 0) {
        printf("vsock %s:%s: connect: %s\n", cid, port, strerror(errno));
        return 1;
    }
    printf("vsock %s:%s: connected\n", cid, port);
    return 0;
}

/* Touches every page, so the memory is really used, not just reserved. */
static int cmd_eat(void)
{
    const size_t chunk = 1 << 20;
    for (size_t mib = 1;; mib++) {
        char *p = malloc(chunk);
        if (!p) {
            printf("malloc failed after %zu MiB\n", mib - 1);
            return 1;
        }
        memset(p, (int)mib, chunk);
        if (mib % 16 == 0) {
            printf("ate %zu MiB\n", mib);
            fflush(stdout);
        }
    }
}

/* One protocol frame (docs/protocol.md): u32 LE length of kind + payload. */
static size_t frame(unsigned char *out, unsigned char kind, const void *payload,
                    size_t len)
{
    uint32_t n = (uint32_t)len + 1;
    memcpy(out, &n, 4);
    out[4] = kind;
    memcpy(out + 5, payload, len);
    return len + 5;
}

static int write_all(int fd, const unsigned char *buf, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, buf, len);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
            usleep(1000);
            continue;
        }
        if (n <= 0)
            return -1;
        buf += n;
        len -= (size_t)n;
    }
    return 0;
}

/* A line on the guest console (the kernel's log at level err, which
 * `quiet` still prints): how a hijack went once the agent relays our
 * output no more. Through a sandbox `mvm logs` shows it, and the
 * battery's teardown prints these lines. */
static void console_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void console_note(const char *fmt, ...)
{
    char line[256];
    int head = snprintf(line, sizeof line, "<3>attacker: ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + head, sizeof line - (size_t)head, fmt, ap);
    va_end(ap);
    int fd = open("/dev/kmsg", O_WRONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t ignored = write(fd, line, strlen(line));
        (void)ignored;
        close(fd);
    }
}

/* write_all, noting on the console how long it took and how it ended. */
static int write_all_noted(int fd, const void *buf, size_t len, const char *what)
{
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = write_all(fd, buf, len);
    int err = errno;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    long ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
    console_note("hijack: %s: %zu bytes %s after %ld ms", what, len,
                 rc == 0 ? "written" : strerror(err), ms);
    return rc;
}

/* The parent of `pid`, from /proc/PID/stat ("PID (COMM) STATE PPID ..."),
 * or 0. */
static int parent_of(int pid)
{
    char path[64], line[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char *ok = fgets(line, sizeof line, f);
    fclose(f);
    char *close_paren = ok ? strrchr(line, ')') : NULL;
    int ppid = 0;
    if (!close_paren || sscanf(close_paren + 1, " %*c %d", &ppid) != 1)
        return 0;
    return ppid;
}

/* A connected vsock stream of process `pid` whose peer is the host, or -1
 * (with *denied set when pidfd_getfd said EPERM). */
static int host_connection_of(int pid, int *denied)
{
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pidfd < 0)
        return -1;
    for (int target = 0; target < 1024; target++) {
        int fd = (int)syscall(SYS_pidfd_getfd, pidfd, target, 0);
        if (fd < 0) {
            if (errno == EPERM) {
                printf("hijack: pidfd_getfd(%d): %s\n", pid, strerror(errno));
                *denied = 1;
                break;
            }
            continue;
        }
        struct sockaddr_vm peer;
        socklen_t len = sizeof peer;
        if (getpeername(fd, (struct sockaddr *)&peer, &len) == 0 &&
            peer.svm_family == AF_VSOCK && peer.svm_cid == VMADDR_CID_HOST) {
            close(pidfd);
            return fd;
        }
        close(fd);
    }
    close(pidfd);
    return -1;
}

/* The agent's connection and the process that holds it: PID 1 (mvm run's
 * agent), else the nearest ancestor of ours that holds one (a sandbox's
 * agent serves each command from a process forked for it). */
static int steal_host_connection(int *owner)
{
    int denied = 0;
    int fd = host_connection_of(1, &denied);
    if (fd >= 0) {
        *owner = 1;
        return fd;
    }
    for (int pid = getppid(); pid > 1 && !denied; pid = parent_of(pid)) {
        fd = host_connection_of(pid, &denied);
        if (fd >= 0) {
            *owner = pid;
            return fd;
        }
    }
    if (!denied)
        printf("hijack: no vsock connection to the host in PID 1 or an ancestor\n");
    return -1;
}

static int cmd_hijack(const char *mode)
{
    static unsigned char buf[(1 << 20) + 64];
    size_t len = 0;
    if (strcmp(mode, "forge") == 0) {
        /* Well-formed frames: what the host must accept from the agent. */
        const char out[] = "FORGED-BY-THE-GUEST\n";
        const char exit_json[] = "{\"code\":42,\"signal\":null,\"status\":42}";
        len = frame(buf, 17, out, sizeof out - 1);
        len += frame(buf + len, 19, exit_json, sizeof exit_json - 1);
    } else if (strcmp(mode, "oversized") == 0) {
        /* A length of 4 GiB - 1, then some of the promised bytes. */
        memset(buf, 0xff, 4);
        memset(buf + 4, 'A', 65536);
        len = 4 + 65536;
    } else if (strcmp(mode, "empty") == 0) {
        memset(buf, 0, 4);
        len = 4;
    } else if (strcmp(mode, "version") == 0) {
        const char hello[] = "{\"version\":99}";
        len = frame(buf, 1, hello, sizeof hello - 1);
    } else if (strcmp(mode, "bigdata") == 0) {
        /* A Stdout frame within MAX_FRAME but over MAX_DATA (64 KiB). */
        static unsigned char data[1 << 20];
        memset(data, 'D', sizeof data - 8);
        len = frame(buf, 17, data, sizeof data - 8);
    } else if (strcmp(mode, "garbage") == 0) {
        /* Small lengths with unknown kinds and bad JSON, then noise. */
        const char junk[] = "{not json";
        len = frame(buf, 0x7f, "x", 1);
        len += frame(buf + len, 19, junk, sizeof junk - 1);
        uint64_t x = 0x9e3779b97f4a7c15u;
        for (int i = 0; i < 4096; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            buf[len++] = (unsigned char)x;
        }
    } else {
        return usage();
    }
    int agent = 0;
    int fd = steal_host_connection(&agent);
    if (fd < 0)
        return 1;
    printf("hijack: freezing the agent, then writing %zu bytes (%s) to the host "
           "on its connection\n",
           len, mode);
    fflush(stdout);
    /* Let that line reach the host first, relayed by the agent. */
    sleep(1);
    /* A guest that owns its kernel does not politely reboot when the host
     * hangs up: stop the agent, so that only the host can end the run.
     * The agent relays our output no more, so say how that went in a
     * Stderr frame of our own. */
    char said[160];
    if (ptrace(PTRACE_SEIZE, agent, NULL, NULL) == 0 &&
        ptrace(PTRACE_INTERRUPT, agent, NULL, NULL) == 0)
        snprintf(said, sizeof said, "hijack: the agent is stopped\n");
    else
        snprintf(said, sizeof said, "hijack: cannot stop the agent: %s\n", strerror(errno));
    console_note("hijack: agent pid %d, its connection fd %d here: %s", agent, fd, said);
    static unsigned char note[256];
    size_t note_len = frame(note, 18, said, strlen(said));
    /* The host may hang up mid-write: that must not end us (and with us
     * the agent's stop). */
    signal(SIGPIPE, SIG_IGN);
    if (write_all_noted(fd, note, note_len, "note frame") == 0)
        write_all_noted(fd, buf, len, mode);
    /* Stay alive (and keep the agent frozen): the host's reaction, not our
     * exit, must end the run. */
    sleep(600);
    printf("hijack: still running after 600 s\n");
    return 0;
}

/* reboot(2) itself, as `reboot -f` would call it: images need not have a
 * reboot tool (Debian's comes with an init system). */
static int cmd_reboot(void)
{
    sync();
    if (reboot(RB_AUTOBOOT) < 0) {
        printf("reboot: %s\n", strerror(errno));
        return 1;
    }
    printf("reboot: returned\n");
    return 0;
}

/* The status port guest-init reports the command's exit on: an `out` to
 * it without I/O permission faults (SIGSEGV), as it must for every process
 * but guest-init; with `enable`, ioperm(2) asks for it first (which only a
 * root with CAP_SYS_RAWIO gets). */
static int cmd_port(const char *value, int enable)
{
    if (enable && ioperm(0x444, 4, 1) != 0) {
        printf("port: ioperm: %s\n", strerror(errno));
        return 1;
    }
    printf("port: writing %s\n", value);
    fflush(stdout);
    outl((unsigned int)strtoul(value, NULL, 10), 0x444);
    printf("port: wrote\n");
    return 0;
}

/* Opens PATH read-write (read-only for /proc/kcore); one line either way.
 * Returns 1 if it opened. */
static int try_open(const char *name, const char *path, int flags)
{
    int fd = open(path, flags | O_CLOEXEC);
    if (fd < 0) {
        printf("%s: refused (%s)\n", name, strerror(errno));
        return 0;
    }
    close(fd);
    printf("%s: opened\n", name);
    return 1;
}

/* A character node for MAJOR:MINOR made in DIR, then opened. */
static int try_node(const char *name, const char *dir, unsigned minor)
{
    char path[512];
    snprintf(path, sizeof path, "%s/attacker-%s", dir, name);
    unlink(path);
    if (mknod(path, S_IFCHR | 0600, makedev(1, minor)) != 0) {
        printf("%s: refused (mknod: %s)\n", name, strerror(errno));
        return 0;
    }
    int opened = try_open(name, path, O_RDWR);
    unlink(path);
    return opened;
}

/* A system call that should not exist in this kernel at all. */
static int try_syscall(const char *name, long nr, long a, long b, long c, long d)
{
    if (syscall(nr, a, b, c, d) == 0) {
        printf("%s: opened\n", name);
        return 1;
    }
    printf("%s: refused (%s)\n", name, strerror(errno));
    return 0;
}

static int cmd_memory(const char *dir)
{
    static char image[64];
    int opened = 0;
    opened += try_open("dev-mem", "/dev/mem", O_RDWR);
    opened += try_open("dev-kmem", "/dev/kmem", O_RDWR);
    opened += try_open("dev-port", "/dev/port", O_RDWR);
    opened += try_node("node-mem", dir, 1);
    opened += try_node("node-kmem", dir, 2);
    opened += try_node("node-port", dir, 4);
    opened += try_open("kcore", "/proc/kcore", O_RDONLY);
    opened += try_syscall("init-module", SYS_init_module, (long)image, sizeof image, (long)"", 0);
    opened += try_syscall("finit-module", SYS_finit_module, 0, (long)"", 0, 0);
    opened += try_syscall("kexec-load", SYS_kexec_load, 0, 0, 0, 0);
    opened += try_syscall("kexec-file-load", SYS_kexec_file_load, -1, -1, 0, (long)"");
    printf("memory: %d opened\n", opened);

    /* The control: the same mknod and open for /dev/zero (1:5) work. */
    char path[512], byte = 1;
    snprintf(path, sizeof path, "%s/attacker-zero", dir);
    unlink(path);
    int fd = -1;
    if (mknod(path, S_IFCHR | 0600, makedev(1, 5)) == 0)
        fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd >= 0 && read(fd, &byte, 1) == 1 && byte == 0)
        printf("control: zero read 0\n");
    else
        printf("control: failed (%s)\n", strerror(errno));
    if (fd >= 0)
        close(fd);
    unlink(path);
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 2 && strcmp(argv[1], "id") == 0)
        return cmd_id();
    if (argc == 4 && strcmp(argv[1], "inet") == 0)
        return cmd_inet(argv[2], argv[3]);
    if (argc == 3 && strcmp(argv[1], "listen") == 0)
        return cmd_listen(argv[2]);
    if (argc == 4 && strcmp(argv[1], "vsock") == 0)
        return cmd_vsock(argv[2], argv[3]);
    if (argc == 2 && strcmp(argv[1], "eat") == 0)
        return cmd_eat();
    if (argc == 3 && strcmp(argv[1], "port") == 0)
        return cmd_port(argv[2], 0);
    if (argc == 4 && strcmp(argv[1], "port") == 0 && strcmp(argv[3], "enable") == 0)
        return cmd_port(argv[2], 1);
    if (argc == 2 && strcmp(argv[1], "reboot") == 0)
        return cmd_reboot();
    if (argc == 3 && strcmp(argv[1], "hijack") == 0)
        return cmd_hijack(argv[2]);
    if (argc == 3 && strcmp(argv[1], "memory") == 0)
        return cmd_memory(argv[2]);
    return usage();
}
