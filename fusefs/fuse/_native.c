/* The native FUSE front's binding: libfuse3's low-level session, run by native threads outside
 * the GIL, with every request it does not answer itself forwarded to Python through one ring.
 *
 * Only fusefs/fuse/native_front.py imports this module (tests/test_layering.py); the Python side,
 * its rules and the task/thread map are in that module, CONCURRENCY.md and ARCHITECTURE.md.
 *
 * Threads
 *   - receive threads (NTHREADS, started by start()): each blocks reading the session's /dev/fuse
 *     fd (one syscall per request, as libfuse's own multi-threaded loop), reads one request into
 *     its own buffer and lets libfuse
 *     dispatch it to the callbacks below, in that thread, without the GIL.  A callback either
 *     answers at once (FLUSH, FSYNC, FSYNCDIR, IOCTL, FORGET; OPEN and RELEASE of an inode marked
 *     in the pages table) or copies the request into the ring and returns; the fuse_req_t lives
 *     on until Python replies (libfuse frees it in the reply).
 *   - the trio thread (Python, holding the GIL): drain() takes the ring's records in order;
 *     reply_*() answer a forwarded request; set_pages() marks inodes.
 *   - worker threads (Python, GIL released in the call): notify_store, invalidate_inode,
 *     invalidate_entry write to /dev/fuse; libfuse serialises nothing there and needs nothing.
 *   - the fanotify thread (one, `seerfs-fanotify`, only in no_open mode: started by watch(), joined
 *     by unmount() after the receive threads): blocks in poll() on the fanotify group and a stop
 *     eventfd, then under F.lock reads every queued event and pushes it into the ring (push(wait):
 *     never dropped); a receive thread about to forward a READ with fh 0 takes F.lock and does the
 *     same first (fan_flush), so a reader's open precedes its READ in the ring.  It never takes the
 *     GIL and never waits on the daemon: the event's inode comes from statx(AT_STATX_DONT_SYNC).
 *
 * The ring (one mutex, a fixed array of S.cap records (mount()'s `ring`, 4096 by default), FIFO)
 *   - A producer (receive thread) pushes under the mutex and writes 1 to the wake eventfd when no
 *     wake is pending since the last drain and either the record is a forwarded request (a reader
 *     waits for its answer), or trio is idle (the last drain found nothing), or the ring is a
 *     quarter full.  An event pushed while trio is busy wakes nobody: trio, after a drain that
 *     found records, waits at most EVENT_DELAY (native_front.py) before draining again, so events
 *     are booked within that delay and one wake serves many opens.  drain() reads the eventfd
 *     before taking the mutex, and clears the pending flag and sets the idle flag under it, so
 *     trio never sleeps without a timeout on a non-empty ring.
 *   - Nothing is ever dropped: a forwarded request that finds the ring full waits on a condition
 *     variable until the consumer frees room (the kernel queues further requests meanwhile); an
 *     event of a natively answered OPEN/RELEASE that finds it full is not answered natively but
 *     forwarded, i.e. waits the same way.  A receive thread never waits on anything else.
 *   - Order: records leave in the order they entered; an OPEN answered natively pushes its event
 *     before its reply is written, so any later request on that handle (READ, RELEASE) is pushed
 *     after it and Python has seen the open first.
 *
 * Memory lifetime
 *   - Names and write data are copied into malloc'd buffers by the receive thread (libfuse reuses
 *     its buffer for the next request) and freed by drain() once turned into bytes objects.
 *   - A fuse_req_t is handed to Python as an integer and must be answered exactly once: the
 *     Python side replies in a finally, so a request is never answered twice nor forgotten.
 *     Requests left in the ring when the session ends are answered (ENODEV) by unmount().
 *   - The attribute columns (set_attrs(), before start()) are the snapshot's arrays, held as
 *     Py_buffers (each keeps its array alive) and only read by the receive threads; they are set
 *     before any receive thread exists (pthread_create orders the writes before the threads' reads),
 *     never changed while serving (the snapshot is immutable while mounted), and released by
 *     unmount() after every receive thread has been joined.
 *   - The pages table is a byte per inode (calloc'd by mount(), freed by unmount() after every
 *     receive thread has been joined); set_pages writes one byte and a receive thread reads it
 *     with relaxed atomics: a stale read answers one open natively that Python would also have
 *     answered from pages (and READs on that handle are forwarded, so a dropped page is fetched).
 */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE
#define FUSE_USE_VERSION 35
#include <Python.h>
#include <structmember.h>
#include <fuse_lowlevel.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/fanotify.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define NTHREADS 2
#define DRAIN_MAX 1024 /* records one drain() takes at most */
#define FAN_GATHER_NS 2000000 /* the fanotify thread's wait between a wake and its read (no_open) */
#define NATIVE_FH_BASE (UINT64_C(1) << 62) /* native handles: far above Python's counter */

/* Record kinds: FUSE opcodes where forwarded, plus events and the session's own. */
enum {
    OP_END = 0, /* the session ended (unmounted or stopped): run() returns */
    OP_INIT = 1, /* INIT answered: call ops.init() */
    OP_LOOKUP, OP_GETATTR, OP_SETATTR, OP_READLINK, OP_MKNOD, OP_MKDIR, OP_UNLINK, OP_RMDIR,
    OP_SYMLINK, OP_RENAME, OP_LINK, OP_OPEN, OP_READ, OP_WRITE, OP_RELEASE, OP_OPENDIR,
    OP_READDIR, OP_READDIRPLUS, OP_RELEASEDIR, OP_STATFS, OP_SETXATTR, OP_GETXATTR,
    OP_LISTXATTR, OP_REMOVEXATTR, OP_CREATE,
    EV_OPEN = 100, /* an OPEN answered natively: (inode, fh, own), pid */
    EV_RELEASE = 101, /* a RELEASE of a native handle answered natively: (inode, fh) */
    EV_VISIT_REC = 103, /* drain()'s own: an EV_OPEN whose release fold() folded into it */
    EV_BATCH = 102, /* drain()'s record for a run of consecutive events: (EV_BATCH, 0, [opened, inode, fh, pid]*);
                     * opened: 1 an open, 2 an open by one of the daemon's own threads (own_thread), 0 a release,
                     * 3 a visit: an open and its release folded into one (see fold() below) */
    EV_VISIT = 3, /* `opened` of a visit */
};

typedef struct {
    int op;
    fuse_req_t req;
    uint64_t a[8];
    char *s1, *s2;
    size_t n1, n2;
    uint32_t uid, gid, pid, umask;
} rec_t;

static struct {
    struct fuse_session *se;
    int wake_fd; /* eventfd: the ring became non-empty (read by trio) */
    int ended; /* the session ended (stop(), or the kernel): drain() then returns END once */
    pthread_t threads[NTHREADS];
    int nthreads;
    pthread_mutex_t lock;
    pthread_cond_t room;
    rec_t *ring; /* cap records, allocated by mount(), freed by unmount() */
    size_t cap;
    size_t head, count;
    int wake_pending; /* the wake eventfd was written since the last drain */
    int consumer_idle; /* the last drain found nothing: trio waits without a timeout */
    atomic_uchar *pages; /* inode -> 1 when its pages are known pushed */
    uint64_t npages;
    atomic_uint_fast64_t next_fh;
    atomic_uint_fast64_t native_opens, native_releases, native_ioctls, native_getattrs, forwarded, ring_full, batches, visits;
    int mounted;
    int no_open_asked; /* mount()'s no_open: watch() will arm it (INIT is answered accordingly) */
    pid_t self; /* this process (set by mount()): its own opens are read backs, never a reader's */
} S = {.lock = PTHREAD_MUTEX_INITIALIZER,
     .room = PTHREAD_COND_INITIALIZER,
     .wake_fd = -1,
     .consumer_idle = 1};

/* no_open mode (mount()'s `no_open`, armed by watch()): OPEN is answered ENOSYS, so the kernel sets
 * fc->no_open and sends neither OPEN nor RELEASE again on this connection (fs/fuse/file.c,
 * fuse_file_open: every later open gets fh 0 and FOPEN_KEEP_CACHE, so cached pages stay across
 * opens); a READ then carries fh 0 and is forwarded by inode.  Opens are seen instead through
 * fanotify (a mount mark, FAN_OPEN and FAN_CLOSE, FAN_UNLIMITED_QUEUE: root only), read by one
 * thread that pushes them into the ring as the same EV_OPEN/EV_RELEASE events, with fh 0 (the
 * daemon pairs them by inode).
 *   - Order: the fanotify thread reads and pushes under F.lock; a READ with fh 0 first takes F.lock
 *     and moves whatever the queue holds into the ring, then is forwarded: the reader's open
 *     happened before its READ, and fsnotify queued its event during the open, so that open's event
 *     is in the ring before the READ.  A close is queued after the reader's last read returned, so
 *     after its READs.  Nothing is lost: the kernel's queue is unlimited, and events that find the
 *     ring full wait in the backlog (below, in order, ahead of newer ones), never dropped.
 *   - The daemon's own opens (its reads back) are told by the event's pid (the tgid) and dropped.
 *   - The marks: FAN_REPORT_FID spares the event's fd (FUSE encodes its file handle as the nodeid
 *     and generation, FILEID_INO64_GEN), but fanotify refuses it for a mount or filesystem mark on a
 *     filesystem with a zero fsid, which FUSE's statfs gives (fanotify_test_fsid), and allows it
 *     for inode marks.  So watch() marks each directory that holds files (FAN_EVENT_ON_CHILD: the
 *     tree is the snapshot's and never changes) and reads the nodeid from the handle.  Where that
 *     fails it falls back to one mount mark without FID: each event then carries an fd, whose inode
 *     number (the nodeid) is read with statx(AT_STATX_DONT_SYNC, never a request to this daemon),
 *     then closed (no RELEASE: no_open); about 10 us more per event on the fanotify thread.
 *   - fanotify merges an event with one of the same file and pid not read yet: an open and close
 *     merged come as one event (booked as the open, then the release); a reopen by the same
 *     process before the queue is read is booked once. */
static struct {
    int fd; /* the fanotify group, or -1 */
    int stop_fd; /* eventfd: the thread returns */
    pthread_t thread;
    int running;
    pthread_mutex_t lock; /* reading the group and pushing its events: one reader at a time */
    atomic_int armed; /* OPEN is answered ENOSYS from now on */
    int fid; /* events carry a file handle (the nodeid), not an fd */
    atomic_uint_fast64_t opens, releases, own, overflows, enosys;
} F = {.fd = -1, .stop_fd = -1, .lock = PTHREAD_MUTEX_INITIALIZER};

/* GETATTR of a snapshot entry answered from its columns (set_attrs()): inode i + 1 is entry i, as
 * fusefs/meta/ids.py; the same fields, in the same way, as fusefs/fuse/attrs.py's AttrFactory. */
enum { COL_MODE, COL_NLINK, COL_UID, COL_GID, COL_SIZE, COL_ATIME, COL_MTIME, COL_CTIME, NCOLS };

static struct {
    Py_buffer col[NCOLS];
    int is_signed[NCOLS];
    uint64_t n; /* entries; 0: not set, every GETATTR is forwarded */
    unsigned long long blksize;
    double attr_timeout;
} A;

static int64_t cell(int c, uint64_t i) {
    const char *p = (const char *)A.col[c].buf + i * (uint64_t)A.col[c].itemsize;
    int sg = A.is_signed[c];
    switch (A.col[c].itemsize) { /* each branch widened on its own: a ?: would convert signed to unsigned */
    case 1: return sg ? (int64_t) * (const int8_t *)p : (int64_t) * (const uint8_t *)p;
    case 2: return sg ? (int64_t) * (const int16_t *)p : (int64_t) * (const uint16_t *)p;
    case 4: return sg ? (int64_t) * (const int32_t *)p : (int64_t) * (const uint32_t *)p;
    default: return *(const int64_t *)p;
    }
}

static void attr_of(uint64_t entry, struct stat *st) {
    memset(st, 0, sizeof *st);
    st->st_ino = entry + 1;
    st->st_mode = (mode_t)cell(COL_MODE, entry);
    st->st_nlink = (nlink_t)cell(COL_NLINK, entry);
    st->st_uid = (uid_t)cell(COL_UID, entry);
    st->st_gid = (gid_t)cell(COL_GID, entry);
    int64_t size = cell(COL_SIZE, entry);
    st->st_size = size;
    st->st_blksize = (blksize_t)A.blksize;
    st->st_blocks = (size + 511) / 512;
    int64_t t[3] = {cell(COL_ATIME, entry), cell(COL_MTIME, entry), cell(COL_CTIME, entry)};
    struct timespec *ts[3] = {&st->st_atim, &st->st_mtim, &st->st_ctim};
    for (int k = 0; k < 3; k++) { /* as Python's divmod: floor, so a time before 1970 keeps 0 <= nsec < 1e9 */
        int64_t sec = t[k] / 1000000000, nsec = t[k] % 1000000000;
        if (nsec < 0)
            sec -= 1, nsec += 1000000000;
        ts[k]->tv_sec = sec;
        ts[k]->tv_nsec = nsec;
    }
}

static void attrs_release(void) {
    for (int c = 0; c < NCOLS; c++)
        if (A.col[c].obj != NULL)
            PyBuffer_Release(&A.col[c]);
    memset(&A, 0, sizeof A);
}

/* ------------------------------------------------------------------ the ring */

static void wake(void) {
    uint64_t one = 1;
    ssize_t n = write(S.wake_fd, &one, sizeof one);
    (void)n; /* EAGAIN only when the counter is saturated: trio is woken anyway */
}

/* Push a record; wait for room when `wait` > 0, else return 0 when full (counted in ring_full when
 * `wait` is 0); -1: the session ended while waiting (the record is untouched in both). */
static int push(const rec_t *r, int wait) {
    pthread_mutex_lock(&S.lock);
    while (S.count == S.cap) {
        if (wait <= 0) { /* -1: the fanotify backlog's try, not a native open forwarded: not counted */
            pthread_mutex_unlock(&S.lock);
            if (wait == 0)
                atomic_fetch_add(&S.ring_full, 1);
            return 0;
        }
        if (S.ended) { /* nobody drains any more: the caller answers the request itself */
            pthread_mutex_unlock(&S.lock);
            return -1;
        }
        pthread_cond_wait(&S.room, &S.lock);
    }
    S.ring[(S.head + S.count) % S.cap] = *r;
    S.count++;
    /* Wake trio for a request (someone waits for its answer), for an event only when trio is idle
     * (else it comes back within EVENT_DELAY on its own) or the ring fills, and once per drain. */
    int need = !S.wake_pending && (r->op < EV_OPEN || S.consumer_idle || S.count >= S.cap / 4);
    if (need)
        S.wake_pending = 1;
    pthread_mutex_unlock(&S.lock);
    if (need)
        wake();
    return 1;
}

static char *dup_bytes(const char *s, size_t n) {
    char *p = malloc(n ? n : 1);
    if (p && n)
        memcpy(p, s, n);
    return p;
}

static void fill_ctx(rec_t *r, fuse_req_t req) {
    const struct fuse_ctx *c = fuse_req_ctx(req);
    r->uid = c->uid;
    r->gid = c->gid;
    r->pid = c->pid;
    r->umask = c->umask;
}

static void forward(int op, fuse_req_t req, uint64_t a0, uint64_t a1, uint64_t a2, uint64_t a3, const char *s1,
                    size_t n1, const char *s2, size_t n2) {
    rec_t r = {.op = op, .req = req, .a = {a0, a1, a2, a3}};
    if (req)
        fill_ctx(&r, req);
    if (s1) {
        r.s1 = dup_bytes(s1, n1);
        r.n1 = n1;
    }
    if (s2) {
        r.s2 = dup_bytes(s2, n2);
        r.n2 = n2;
    }
    if ((s1 && !r.s1) || (s2 && !r.s2)) {
        free(r.s1);
        free(r.s2);
        fuse_reply_err(req, ENOMEM);
        return;
    }
    atomic_fetch_add(&S.forwarded, 1);
    if (push(&r, 1) < 0) {
        free(r.s1);
        free(r.s2);
        fuse_reply_err(req, ENODEV);
    }
}

/* ------------------------------------------------------------------ fanotify (no_open mode) */

/* The backlog (under F.lock): events read from fanotify that found the ring full, in order.  They
 * are taken out of the kernel's queue anyway, because fanotify merges a queued event with a later
 * one of the same file and process: a queue left to grow while the daemon is busy would lose every
 * reopen of a file (a benchmark's next pass) into the earlier event.  Bounded by memory only, as
 * the kernel's unlimited queue would be; 16 bytes an event. */
typedef struct {
    uint64_t ino;
    uint32_t pid;
    uint32_t opened;
} seen_t;
static struct {
    seen_t *v;
    size_t head, n, cap;
} B;

/* Move the backlog into the ring while it has room; whether the backlog is empty now. */
static int backlog_flush(void) {
    while (B.head < B.n) {
        seen_t *e = &B.v[B.head];
        rec_t r = {.op = e->opened ? EV_OPEN : EV_RELEASE, .a = {e->ino, 0}, .pid = e->pid};
        if (push(&r, -1) <= 0)
            return 0;
        B.head++;
    }
    B.head = B.n = 0;
    return 1;
}

static void push_seen(int opened, uint64_t ino, uint32_t pid) {
    atomic_fetch_add(opened ? &F.opens : &F.releases, 1);
    rec_t r = {.op = opened ? EV_OPEN : EV_RELEASE, .a = {ino, 0}, .pid = pid};
    if (B.head == B.n && push(&r, -1) > 0)
        return; /* the common case: straight into the ring */
    if (B.n == B.cap && B.head > 0) { /* reuse the room of what was flushed */
        memmove(B.v, B.v + B.head, (B.n - B.head) * sizeof *B.v);
        B.n -= B.head;
        B.head = 0;
    }
    if (B.n == B.cap) {
        size_t cap = B.cap ? 2 * B.cap : 4096;
        seen_t *v = realloc(B.v, cap * sizeof *v);
        if (v == NULL) { /* no memory for the backlog: push in order, waiting for room (the kernel queues the rest) */
            for (; B.head < B.n; B.head++) {
                seen_t *e = &B.v[B.head];
                rec_t q = {.op = e->opened ? EV_OPEN : EV_RELEASE, .a = {e->ino, 0}, .pid = e->pid};
                if (push(&q, 1) < 0)
                    return; /* the session ended */
            }
            B.head = B.n = 0;
            push(&r, 1);
            return;
        }
        B.v = v;
        B.cap = cap;
    }
    B.v[B.n++] = (seen_t){.ino = ino, .pid = pid, .opened = (uint32_t)opened};
}

/* Move every event the group holds into the ring, in queue order.  Caller holds F.lock. */
static void fan_read_locked(void) {
    backlog_flush();
    char buf[4096] __attribute__((aligned(__alignof__(struct fanotify_event_metadata))));
    for (;;) {
        ssize_t n = read(F.fd, buf, sizeof buf);
        if (n <= 0)
            return; /* EAGAIN: empty (the group is non-blocking) */
        struct fanotify_event_metadata *md = (struct fanotify_event_metadata *)buf;
        for (; FAN_EVENT_OK(md, n); md = FAN_EVENT_NEXT(md, n)) {
            if (md->vers != FANOTIFY_METADATA_VERSION)
                continue;
            if (md->mask & FAN_Q_OVERFLOW) { /* never with FAN_UNLIMITED_QUEUE; counted if it were */
                atomic_fetch_add(&F.overflows, 1);
                continue;
            }
            uint64_t ino = 0;
            if (F.fid && md->event_len >= md->metadata_len + sizeof(struct fanotify_event_info_fid) + 8) {
                struct fanotify_event_info_fid *info = (struct fanotify_event_info_fid *)((char *)md + md->metadata_len);
                struct file_handle *h = (struct file_handle *)info->handle;
                if (info->hdr.info_type == FAN_EVENT_INFO_TYPE_FID && h->handle_bytes >= 8) {
                    uint32_t w[2];
                    memcpy(w, h->f_handle, sizeof w); /* fuse_encode_fh: nodeid >> 32, nodeid & 0xffffffff */
                    ino = ((uint64_t)w[0] << 32) | w[1];
                }
            }
            if (md->fd >= 0) {
                struct statx stx;
                if (statx(md->fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_INO, &stx) == 0)
                    ino = stx.stx_ino;
                close(md->fd);
            }
            if (md->pid == S.self) {
                atomic_fetch_add(&F.own, 1);
                continue;
            }
            if (ino == 0)
                continue;
            if (md->mask & FAN_OPEN)
                push_seen(1, ino, (uint32_t)md->pid);
            if (md->mask & FAN_CLOSE)
                push_seen(0, ino, (uint32_t)md->pid);
        }
    }
}

/* A READ with fh 0 is about to be forwarded: its reader's open event goes into the ring first. */
static void fan_flush(void) {
    if (!atomic_load_explicit(&F.armed, memory_order_acquire))
        return;
    pthread_mutex_lock(&F.lock);
    if (F.fd >= 0)
        fan_read_locked();
    pthread_mutex_unlock(&F.lock);
}

static void *fan_loop(void *arg) {
    (void)arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    pthread_setname_np(pthread_self(), "seerfs-fanotify");
    struct pollfd p[2] = {{.fd = F.fd, .events = POLLIN}, {.fd = F.stop_fd, .events = POLLIN}};
    for (;;) {
        pthread_mutex_lock(&F.lock);
        int backlog = B.head < B.n;
        pthread_mutex_unlock(&F.lock);
        int n = poll(p, 2, backlog ? FAN_GATHER_NS / 1000000 : -1); /* a backlog: retry the ring soon */
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 || p[1].revents)
            break;
        if (n == 0) {
            pthread_mutex_lock(&F.lock);
            backlog_flush();
            pthread_mutex_unlock(&F.lock);
            continue;
        }
        /* Let events gather before reading them: woken per event, the thread cost the daemon about
         * 16 us per warm open (wake-ups, one read and one push per event); 2 ms gathers a
         * run of them per wake.  A READ never waits for this: fan_flush() reads the queue itself. */
        struct timespec gather = {.tv_sec = 0, .tv_nsec = FAN_GATHER_NS};
        nanosleep(&gather, NULL);
        pthread_mutex_lock(&F.lock);
        fan_read_locked();
        pthread_mutex_unlock(&F.lock);
        pthread_mutex_lock(&S.lock);
        int ended = S.ended;
        pthread_mutex_unlock(&S.lock);
        if (ended)
            break;
    }
    return NULL;
}

/* Stop the fanotify thread and close the group (unmount(): after the receive threads ended). */
static void fan_stop(void) {
    atomic_store(&F.armed, 0);
    if (F.running) {
        uint64_t one = 1;
        ssize_t w = write(F.stop_fd, &one, sizeof one);
        (void)w;
        pthread_join(F.thread, NULL);
        F.running = 0;
    }
    if (F.fd >= 0)
        close(F.fd);
    if (F.stop_fd >= 0)
        close(F.stop_fd);
    F.fd = F.stop_fd = -1;
    free(B.v); /* events not booked when the session ended: nobody will */
    B.v = NULL;
    B.head = B.n = B.cap = 0;
}

/* ------------------------------------------------------------------ callbacks (receive threads) */

static void ll_init(void *userdata, struct fuse_conn_info *conn) {
    (void)userdata;
    if (conn->capable & FUSE_CAP_READDIRPLUS)
        conn->want |= FUSE_CAP_READDIRPLUS;
    /* no_open: with atomic O_TRUNC the kernel leaves truncation to the OPEN it will no longer send
     * (fuse_setattr skips the request), so `echo N > .control/seed` would never reach the daemon
     * as a truncate: without it, O_TRUNC arrives as SETATTR(size 0) before the open, as the
     * control files already accept. */
    if (S.no_open_asked)
        conn->want &= ~FUSE_CAP_ATOMIC_O_TRUNC;
    rec_t r = {.op = OP_INIT};
    push(&r, 1);
}

static void ll_lookup(fuse_req_t req, fuse_ino_t parent, const char *name) {
    forward(OP_LOOKUP, req, parent, 0, 0, 0, name, strlen(name), NULL, 0);
}

static void ll_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup) {
    (void)ino;
    (void)nlookup;
    fuse_reply_none(req); /* inodes are the snapshot's and live as long as the mount */
}

static void ll_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets) {
    (void)count;
    (void)forgets;
    fuse_reply_none(req);
}

static void ll_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    (void)fi;
    if (ino >= 1 && ino - 1 < A.n) { /* a snapshot entry: its columns (control files are forwarded) */
        struct stat st;
        attr_of(ino - 1, &st);
        atomic_fetch_add(&S.native_getattrs, 1);
        fuse_reply_attr(req, &st, A.attr_timeout);
        return;
    }
    forward(OP_GETATTR, req, ino, 0, 0, 0, NULL, 0, NULL, 0);
}

static void ll_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set, struct fuse_file_info *fi) {
    rec_t r = {.op = OP_SETATTR, .req = req};
    fill_ctx(&r, req);
    r.a[0] = ino;
    r.a[1] = (uint64_t)to_set;
    r.a[2] = (uint64_t)attr->st_size;
    r.a[3] = attr->st_mode;
    r.a[4] = attr->st_uid;
    r.a[5] = attr->st_gid;
    r.a[6] = fi ? fi->fh : 0;
    r.a[7] = fi != NULL;
    atomic_fetch_add(&S.forwarded, 1);
    if (push(&r, 1) < 0)
        fuse_reply_err(req, ENODEV);
}

static void ll_readlink(fuse_req_t req, fuse_ino_t ino) { forward(OP_READLINK, req, ino, 0, 0, 0, NULL, 0, NULL, 0); }

static void ll_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, dev_t rdev) {
    forward(OP_MKNOD, req, parent, mode, rdev, 0, name, strlen(name), NULL, 0);
}

static void ll_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode) {
    forward(OP_MKDIR, req, parent, mode, 0, 0, name, strlen(name), NULL, 0);
}

static void ll_unlink(fuse_req_t req, fuse_ino_t parent, const char *name) {
    forward(OP_UNLINK, req, parent, 0, 0, 0, name, strlen(name), NULL, 0);
}

static void ll_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name) {
    forward(OP_RMDIR, req, parent, 0, 0, 0, name, strlen(name), NULL, 0);
}

static void ll_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name) {
    forward(OP_SYMLINK, req, parent, 0, 0, 0, name, strlen(name), link, strlen(link));
}

static void ll_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent, const char *newname,
                      unsigned int flags) {
    forward(OP_RENAME, req, parent, newparent, flags, 0, name, strlen(name), newname, strlen(newname));
}

static void ll_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char *newname) {
    forward(OP_LINK, req, ino, newparent, 0, 0, newname, strlen(newname), NULL, 0);
}

static int pushed(fuse_ino_t ino) {
    return S.pages != NULL && ino < S.npages && atomic_load_explicit(&S.pages[ino], memory_order_relaxed);
}

/* Whether the thread that sent a request (a request's pid is the thread's id) is one of this
 * process's: the daemon reading pages back through its own mount (fusefs/readpath/staging.py,
 * ThroughMount.read_pages), an open no reader made.  Decided here, while that thread waits in
 * open(2) and so cannot have exited: booked later by trio, after the read back may have ended,
 * the thread id would say nothing any more.  tgkill with signal 0 sends nothing; it fails (ESRCH)
 * unless the thread is in this thread group. */
static int own_thread(pid_t tid) {
    return tid > 0 && syscall(SYS_tgkill, S.self, tid, 0) == 0;
}

static void ll_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    if (atomic_load_explicit(&F.armed, memory_order_acquire)) {
        atomic_fetch_add(&F.enosys, 1);
        fuse_reply_err(req, ENOSYS); /* no_open: the kernel sends no OPEN or RELEASE from now on */
        return;
    }
    if ((fi->flags & O_ACCMODE) == O_RDONLY && !(fi->flags & (O_TRUNC | O_APPEND | O_CREAT)) && pushed(ino)) {
        uint64_t fh = NATIVE_FH_BASE + atomic_fetch_add(&S.next_fh, 1);
        rec_t r = {.op = EV_OPEN, .a = {ino, fh}};
        fill_ctx(&r, req);
        r.a[2] = (uint64_t)own_thread((pid_t)r.pid);
        if (push(&r, 0)) { /* the event first: Python sees the open before any request on fh */
            fi->fh = fh;
            fi->keep_cache = 1;
            fi->direct_io = 0;
            atomic_fetch_add(&S.native_opens, 1);
            fuse_reply_open(req, fi);
            return;
        }
        /* the ring is full: forward the open instead (waits for room), never drop the event */
    }
    forward(OP_OPEN, req, ino, (uint64_t)(unsigned)fi->flags, 0, 0, NULL, 0, NULL, 0);
}

static void ll_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi) {
    if (fi->fh == 0)
        fan_flush(); /* no_open: the reader's open event before its READ */
    forward(OP_READ, req, fi->fh, (uint64_t)off, size, ino, NULL, 0, NULL, 0);
}

static void ll_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
                     struct fuse_file_info *fi) {
    forward(OP_WRITE, req, fi->fh, (uint64_t)off, size, ino, NULL, 0, buf, size);
}

static void ll_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    if (fi->fh >= NATIVE_FH_BASE) {
        rec_t r = {.op = EV_RELEASE, .a = {ino, fi->fh}};
        fill_ctx(&r, req);
        if (push(&r, 0)) {
            atomic_fetch_add(&S.native_releases, 1);
            fuse_reply_err(req, 0);
            return;
        }
    }
    forward(OP_RELEASE, req, fi->fh, ino, 0, 0, NULL, 0, NULL, 0);
}

static void ll_enosys(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    (void)ino;
    (void)fi;
    fuse_reply_err(req, ENOSYS); /* FLUSH: the kernel then stops sending it */
}

static void ll_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi) {
    (void)ino;
    (void)datasync;
    (void)fi;
    fuse_reply_err(req, ENOSYS);
}

static void ll_ioctl(fuse_req_t req, fuse_ino_t ino, unsigned int cmd, void *arg, struct fuse_file_info *fi,
                     unsigned flags, const void *in_buf, size_t in_bufsz, size_t out_bufsz) {
    (void)ino, (void)cmd, (void)arg, (void)fi, (void)flags, (void)in_buf, (void)in_bufsz, (void)out_bufsz;
    atomic_fetch_add(&S.native_ioctls, 1);
    fuse_reply_err(req, ENOTTY); /* isatty() of every file CPython opens: no file here is a tty */
}

static void ll_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    (void)fi;
    forward(OP_OPENDIR, req, ino, 0, 0, 0, NULL, 0, NULL, 0);
}

static void ll_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi) {
    forward(OP_READDIR, req, fi->fh, (uint64_t)off, size, ino, NULL, 0, NULL, 0);
}

static void ll_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi) {
    forward(OP_READDIRPLUS, req, fi->fh, (uint64_t)off, size, ino, NULL, 0, NULL, 0);
}

static void ll_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    forward(OP_RELEASEDIR, req, fi->fh, ino, 0, 0, NULL, 0, NULL, 0);
}

static void ll_fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi) {
    ll_fsync(req, ino, datasync, fi);
}

static void ll_statfs(fuse_req_t req, fuse_ino_t ino) { forward(OP_STATFS, req, ino, 0, 0, 0, NULL, 0, NULL, 0); }

static void ll_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value, size_t size, int flags) {
    forward(OP_SETXATTR, req, ino, (uint64_t)flags, 0, 0, name, strlen(name), value, size);
}

static void ll_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size) {
    forward(OP_GETXATTR, req, ino, size, 0, 0, name, strlen(name), NULL, 0);
}

static void ll_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
    forward(OP_LISTXATTR, req, ino, size, 0, 0, NULL, 0, NULL, 0);
}

static void ll_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name) {
    forward(OP_REMOVEXATTR, req, ino, 0, 0, 0, name, strlen(name), NULL, 0);
}

static void ll_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, struct fuse_file_info *fi) {
    forward(OP_CREATE, req, parent, mode, (uint64_t)(unsigned)fi->flags, 0, name, strlen(name), NULL, 0);
}

static const struct fuse_lowlevel_ops OPS = {
    .init = ll_init,
    .lookup = ll_lookup,
    .forget = ll_forget,
    .forget_multi = ll_forget_multi,
    .getattr = ll_getattr,
    .setattr = ll_setattr,
    .readlink = ll_readlink,
    .mknod = ll_mknod,
    .mkdir = ll_mkdir,
    .unlink = ll_unlink,
    .rmdir = ll_rmdir,
    .symlink = ll_symlink,
    .rename = ll_rename,
    .link = ll_link,
    .open = ll_open,
    .read = ll_read,
    .write = ll_write,
    .flush = ll_enosys,
    .release = ll_release,
    .fsync = ll_fsync,
    .opendir = ll_opendir,
    .readdir = ll_readdir,
    .readdirplus = ll_readdirplus,
    .releasedir = ll_releasedir,
    .fsyncdir = ll_fsyncdir,
    .statfs = ll_statfs,
    .setxattr = ll_setxattr,
    .getxattr = ll_getxattr,
    .listxattr = ll_listxattr,
    .removexattr = ll_removexattr,
    .create = ll_create,
    .ioctl = ll_ioctl,
};

/* ------------------------------------------------------------------ receive threads */

/* The session ended: drain() hands trio END (once the ring is empty) and run() returns. */
static void end_session(void) {
    pthread_mutex_lock(&S.lock);
    int first = !S.ended;
    S.ended = 1;
    pthread_cond_broadcast(&S.room); /* a thread waiting for room gives up */
    pthread_mutex_unlock(&S.lock);
    if (first)
        wake();
}

static void free_buf(void *p) { free(((struct fuse_buf *)p)->mem); }

/* Cancellation: a receive thread can be cancelled only while it blocks in the read of /dev/fuse
 * (as in libfuse's fuse_loop_mt): never while it holds the ring's mutex or is inside a callback. */
static void *receive_loop(void *arg) {
    (void)arg;
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL); /* signals go to the trio thread */
    pthread_setname_np(pthread_self(), "seerfs-fuse"); /* shows in top -H and /proc/PID/task/TID/comm */
    struct fuse_buf buf = {.mem = NULL};
    pthread_cleanup_push(free_buf, &buf);
    while (!fuse_session_exited(S.se)) {
        pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, NULL);
        int n = fuse_session_receive_buf(S.se, &buf);
        pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);
        if (n == -EINTR || n == -EAGAIN)
            continue;
        if (n <= 0) {
            fuse_session_exit(S.se); /* ENODEV (unmounted) sets exited itself and returns 0 */
            break;
        }
        fuse_session_process_buf(S.se, &buf);
    }
    pthread_cleanup_pop(1);
    end_session(); /* the kernel ended it (every blocked read returns ENODEV), or stop() did */
    return NULL;
}

/* ------------------------------------------------------------------ EntryAttributes */

typedef struct {
    PyObject_HEAD
    unsigned long long st_ino, generation, st_mode, st_nlink, st_uid, st_gid, st_rdev, st_size, st_blksize,
        st_blocks;
    long long st_atime_ns, st_ctime_ns, st_mtime_ns;
    double entry_timeout, attr_timeout;
} Attrs;

#define M(name, type) {#name, type, offsetof(Attrs, name), 0, NULL}
static PyMemberDef attrs_members[] = {
    M(st_ino, T_ULONGLONG), M(generation, T_ULONGLONG), M(st_mode, T_ULONGLONG), M(st_nlink, T_ULONGLONG),
    M(st_uid, T_ULONGLONG), M(st_gid, T_ULONGLONG), M(st_rdev, T_ULONGLONG), M(st_size, T_ULONGLONG),
    M(st_blksize, T_ULONGLONG), M(st_blocks, T_ULONGLONG), M(st_atime_ns, T_LONGLONG), M(st_ctime_ns, T_LONGLONG),
    M(st_mtime_ns, T_LONGLONG), M(entry_timeout, T_DOUBLE), M(attr_timeout, T_DOUBLE), {NULL}};
#undef M

static PyTypeObject AttrsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fusefs.fuse._native.EntryAttributes",
    .tp_basicsize = sizeof(Attrs),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_members = attrs_members,
    .tp_doc = "An entry's attributes as the kernel caches them (fusefs.fuse.front.EntryAttributes).",
};

static int get_u64(PyObject *o, const char *name, unsigned long long *out) {
    PyObject *v = PyObject_GetAttrString(o, name);
    if (!v)
        return -1;
    *out = PyLong_AsUnsignedLongLongMask(v);
    Py_DECREF(v);
    return PyErr_Occurred() ? -1 : 0;
}

static int get_f64(PyObject *o, const char *name, double *out) {
    PyObject *v = PyObject_GetAttrString(o, name);
    if (!v)
        return -1;
    *out = PyFloat_AsDouble(v);
    Py_DECREF(v);
    return PyErr_Occurred() ? -1 : 0;
}

/* Fill `e` from our record, or from any object with the fields (a front-free PlainAttributes). */
static int to_entry(PyObject *o, struct fuse_entry_param *e) {
    memset(e, 0, sizeof *e);
    if (Py_IS_TYPE(o, &AttrsType)) {
        Attrs *a = (Attrs *)o;
        e->ino = a->st_ino;
        e->generation = a->generation;
        e->entry_timeout = a->entry_timeout;
        e->attr_timeout = a->attr_timeout;
        e->attr.st_ino = a->st_ino;
        e->attr.st_mode = a->st_mode;
        e->attr.st_nlink = a->st_nlink;
        e->attr.st_uid = a->st_uid;
        e->attr.st_gid = a->st_gid;
        e->attr.st_rdev = a->st_rdev;
        e->attr.st_size = a->st_size;
        e->attr.st_blksize = a->st_blksize;
        e->attr.st_blocks = a->st_blocks;
        e->attr.st_atim.tv_sec = a->st_atime_ns / 1000000000;
        e->attr.st_atim.tv_nsec = a->st_atime_ns % 1000000000;
        e->attr.st_mtim.tv_sec = a->st_mtime_ns / 1000000000;
        e->attr.st_mtim.tv_nsec = a->st_mtime_ns % 1000000000;
        e->attr.st_ctim.tv_sec = a->st_ctime_ns / 1000000000;
        e->attr.st_ctim.tv_nsec = a->st_ctime_ns % 1000000000;
        return 0;
    }
    unsigned long long v[13];
    static const char *names[] = {"st_ino",  "generation", "st_mode",    "st_nlink",    "st_uid",
                                  "st_gid",  "st_rdev",    "st_size",    "st_blksize",  "st_blocks",
                                  "st_atime_ns", "st_mtime_ns", "st_ctime_ns"};
    for (int i = 0; i < 13; i++)
        if (get_u64(o, names[i], &v[i]) < 0)
            return -1;
    if (get_f64(o, "entry_timeout", &e->entry_timeout) < 0 || get_f64(o, "attr_timeout", &e->attr_timeout) < 0)
        return -1;
    e->ino = e->attr.st_ino = v[0];
    e->generation = v[1];
    e->attr.st_mode = v[2];
    e->attr.st_nlink = v[3];
    e->attr.st_uid = v[4];
    e->attr.st_gid = v[5];
    e->attr.st_rdev = v[6];
    e->attr.st_size = v[7];
    e->attr.st_blksize = v[8];
    e->attr.st_blocks = v[9];
    e->attr.st_atim.tv_sec = v[10] / 1000000000;
    e->attr.st_atim.tv_nsec = v[10] % 1000000000;
    e->attr.st_mtim.tv_sec = v[11] / 1000000000;
    e->attr.st_mtim.tv_nsec = v[11] % 1000000000;
    e->attr.st_ctim.tv_sec = v[12] / 1000000000;
    e->attr.st_ctim.tv_nsec = v[12] % 1000000000;
    return 0;
}

/* ------------------------------------------------------------------ DirBuffer: one readdir reply */

typedef struct {
    PyObject_HEAD
    fuse_req_t req;
    char *buf;
    size_t size, used;
    int plus;
} DirBuf;

static void dirbuf_dealloc(DirBuf *self) {
    free(self->buf);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* add(name, attrs, next_id) -> bool: whether the entry fit (False: the reply is full). */
static PyObject *dirbuf_add(DirBuf *self, PyObject *args) {
    const char *name;
    Py_ssize_t nlen;
    PyObject *attrs;
    long long next;
    if (!PyArg_ParseTuple(args, "y#OL", &name, &nlen, &attrs, &next))
        return NULL;
    if (self->buf == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "readdir reply already sent");
        return NULL;
    }
    struct fuse_entry_param e;
    if (to_entry(attrs, &e) < 0)
        return NULL;
    char cname[1024];
    if ((size_t)nlen >= sizeof cname) {
        PyErr_SetString(PyExc_ValueError, "name too long");
        return NULL;
    }
    memcpy(cname, name, nlen);
    cname[nlen] = 0;
    size_t rest = self->size - self->used, n;
    if (self->plus)
        n = fuse_add_direntry_plus(self->req, self->buf + self->used, rest, cname, &e, next);
    else
        n = fuse_add_direntry(self->req, self->buf + self->used, rest, cname, &e.attr, next);
    if (n > rest)
        Py_RETURN_FALSE;
    self->used += n;
    Py_RETURN_TRUE;
}

static PyObject *dirbuf_reply(DirBuf *self, PyObject *noargs) {
    (void)noargs;
    if (self->buf == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "readdir reply already sent");
        return NULL;
    }
    fuse_reply_buf(self->req, self->buf, self->used);
    free(self->buf);
    self->buf = NULL;
    Py_RETURN_NONE;
}

static PyMethodDef dirbuf_methods[] = {
    {"add", (PyCFunction)dirbuf_add, METH_VARARGS, "add(name, attrs, next_id) -> bool: whether it fit"},
    {"reply", (PyCFunction)dirbuf_reply, METH_NOARGS, "send the entries added so far (answers the request)"},
    {NULL}};

static PyTypeObject DirBufType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fusefs.fuse._native.DirBuffer",
    .tp_basicsize = sizeof(DirBuf),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)dirbuf_dealloc,
    .tp_methods = dirbuf_methods,
    .tp_doc = "One READDIR(PLUS) reply being filled (made by dir_buffer()).",
};

/* ------------------------------------------------------------------ module functions */

static fuse_req_t as_req(PyObject *o) { return (fuse_req_t)PyLong_AsVoidPtr(o); }

static PyObject *py_mount(PyObject *m, PyObject *args) {
    (void)m;
    const char *mountpoint, *options;
    unsigned long long npages, cap = 4096;
    int no_open = 0;
    if (!PyArg_ParseTuple(args, "ssK|Kp", &mountpoint, &options, &npages, &cap, &no_open))
        return NULL;
    if (cap < 1 || cap > (1u << 24)) {
        PyErr_SetString(PyExc_ValueError, "ring: 1 to 2**24 records");
        return NULL;
    }
    if (S.se != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a native session is already mounted in this process");
        return NULL;
    }
    char *argv[] = {"seerfs", "-o", (char *)options, NULL};
    struct fuse_args fargs = FUSE_ARGS_INIT(options[0] ? 3 : 1, argv);
    S.pages = calloc(npages ? npages : 1, 1);
    S.npages = npages;
    S.ring = calloc(cap, sizeof(rec_t));
    S.cap = cap;
    S.head = S.count = 0;
    S.wake_pending = 0;
    S.consumer_idle = 1;
    atomic_store(&S.next_fh, 0);
    S.ended = 0;
    S.no_open_asked = no_open;
    S.self = getpid();
    S.wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (!S.pages || !S.ring)
        goto fail;
    if (S.wake_fd < 0) {
        PyErr_SetFromErrno(PyExc_OSError); /* EMFILE, ENFILE: the fd trio is woken through */
        goto fail_set;
    }
    S.se = fuse_session_new(&fargs, &OPS, sizeof OPS, NULL);
    if (S.se == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "fuse_session_new failed (bad mount options?)");
        goto fail_set;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = fuse_session_mount(S.se, mountpoint);
    Py_END_ALLOW_THREADS if (rc != 0) {
        PyErr_Format(PyExc_RuntimeError, "fuse_session_mount(%s) failed", mountpoint);
        fuse_session_destroy(S.se);
        S.se = NULL;
        goto fail_set;
    }
    S.mounted = 1;
    return PyLong_FromLong(S.wake_fd);
fail:
    PyErr_NoMemory();
fail_set:
    free(S.pages);
    S.pages = NULL;
    free(S.ring);
    S.ring = NULL;
    if (S.wake_fd >= 0)
        close(S.wake_fd);
    S.wake_fd = -1;
    return NULL;
}

static PyObject *py_start(PyObject *m, PyObject *noargs) {
    (void)m, (void)noargs;
    if (S.se == NULL || S.nthreads) {
        PyErr_SetString(PyExc_RuntimeError, "not mounted, or already started");
        return NULL;
    }
    for (int i = 0; i < NTHREADS; i++) {
        int err = pthread_create(&S.threads[i], NULL, receive_loop, NULL);
        if (err) {
            errno = err;
            if (i == 0) {
                PyErr_SetFromErrno(PyExc_OSError);
                return NULL;
            }
            break;
        }
        S.nthreads++;
    }
    Py_RETURN_NONE;
}

/* Cancel the receive threads (only ever blocked in their read at a cancellation point). */
static void cancel_threads(void) {
    for (int i = 0; i < S.nthreads; i++)
        pthread_cancel(S.threads[i]);
}

static PyObject *py_stop(PyObject *m, PyObject *noargs) {
    (void)m, (void)noargs;
    if (S.se != NULL) {
        fuse_session_exit(S.se);
        end_session();
        cancel_threads();
    }
    Py_RETURN_NONE;
}

static PyObject *py_unmount(PyObject *m, PyObject *noargs) {
    (void)m, (void)noargs;
    if (S.se == NULL)
        Py_RETURN_NONE;
    fuse_session_exit(S.se);
    end_session();
    cancel_threads();
    Py_BEGIN_ALLOW_THREADS for (int i = 0; i < S.nthreads; i++) pthread_join(S.threads[i], NULL);
    fan_stop(); /* after the receive threads: none is in fan_flush() any more */
    Py_END_ALLOW_THREADS S.nthreads = 0;
    attrs_release(); /* no receive thread reads them any more */
    /* Requests no one will answer now: answer them, free their copies. */
    pthread_mutex_lock(&S.lock);
    while (S.count) {
        rec_t *r = &S.ring[S.head];
        if (r->req && r->op < EV_OPEN)
            fuse_reply_err(r->req, ENODEV);
        free(r->s1);
        free(r->s2);
        S.head = (S.head + 1) % S.cap;
        S.count--;
    }
    pthread_mutex_unlock(&S.lock);
    Py_BEGIN_ALLOW_THREADS if (S.mounted) fuse_session_unmount(S.se);
    fuse_session_destroy(S.se);
    Py_END_ALLOW_THREADS S.se = NULL;
    S.mounted = 0;
    close(S.wake_fd);
    S.wake_fd = -1;
    atomic_uchar *pages = S.pages;
    S.pages = NULL;
    S.npages = 0;
    free(pages);
    free(S.ring);
    S.ring = NULL;
    Py_RETURN_NONE;
}

/* A reader's open and its release, in one run of events with no other event on the same inode
 * between them, become one record, a visit (EV_VISIT_REC at the open's place; the release is marked
 * in `folded` and left out): half the records trio books per warm open, and a visit is booked as one
 * step (OpenFiles.book_native, ReadPolicy.readers).  What moves is only the release, earlier past
 * events of other files, whose booking does not depend on it (native_front.py says why).  Opens by
 * the daemon's own threads (a[2]: read backs) are never folded.  The scan for an open's release
 * stops at the first later event on its inode: a release is folded only into the open it closes
 * (the same handle; with fh 0, fanotify's, the next event on that inode). */
static size_t fold(rec_t *batch, size_t n, unsigned char *folded) {
    size_t visits = 0;
    memset(folded, 0, n);
    for (size_t i = 0; i < n; i++) {
        rec_t *o = &batch[i];
        if (o->op != EV_OPEN || o->a[2])
            continue;
        for (size_t j = i + 1; j < n && batch[j].op >= EV_OPEN; j++) {
            rec_t *r = &batch[j];
            if (r->a[0] != o->a[0])
                continue;
            if (r->op == EV_RELEASE && r->a[1] == o->a[1]) {
                o->op = EV_VISIT_REC;
                folded[j] = 1;
                visits++;
            }
            break;
        }
    }
    return visits;
}

/* The run of events batch[i..j) after fold() as drain()'s record (EV_BATCH, 0, flat list), or NULL
 * with an exception set. */
static PyObject *event_run(const rec_t *batch, size_t i, size_t j, const unsigned char *folded) {
    size_t kept = 0;
    for (size_t e = i; e < j; e++)
        kept += !folded[e];
    PyObject *flat = PyList_New((Py_ssize_t)(4 * kept));
    for (size_t e = i, q = 0; flat && e < j; e++) {
        const rec_t *y = &batch[e];
        if (folded[e])
            continue;
        long opened = y->op == EV_VISIT_REC ? EV_VISIT : y->op != EV_OPEN ? 0 : y->a[2] ? 2 : 1; /* 2: own_thread() */
        PyObject *v[4] = {PyLong_FromLong(opened), PyLong_FromUnsignedLongLong(y->a[0]),
                          PyLong_FromUnsignedLongLong(y->a[1]), PyLong_FromUnsignedLong(y->pid)};
        for (int f = 0; f < 4; f++) {
            if (v[f] == NULL) {
                Py_CLEAR(flat);
                for (int g = f + 1; g < 4; g++)
                    Py_XDECREF(v[g]);
                break;
            }
            PyList_SET_ITEM(flat, (Py_ssize_t)(4 * q + f), v[f]);
        }
        q++;
    }
    return flat ? Py_BuildValue("(iiN)", EV_BATCH, 0, flat) : NULL;
}

static PyObject *py_drain(PyObject *m, PyObject *arg) {
    (void)m;
    Py_ssize_t most = PyLong_AsSsize_t(arg);
    if (most < 0 && PyErr_Occurred())
        return NULL;
    if (S.wake_fd < 0)
        return PyList_New(0);
    uint64_t v;
    ssize_t r = read(S.wake_fd, &v, sizeof v); /* before looking: a push after this wakes us again */
    (void)r;
    static rec_t batch[DRAIN_MAX]; /* static: only the trio thread drains (one caller at a time) */
    size_t n = 0;
    if (most > DRAIN_MAX || most <= 0)
        most = DRAIN_MAX;
    pthread_mutex_lock(&S.lock);
    S.wake_pending = 0;
    while (S.count && n < (size_t)most) {
        batch[n++] = S.ring[S.head];
        S.head = (S.head + 1) % S.cap;
        S.count--;
    }
    S.consumer_idle = n == 0;
    if (n)
        pthread_cond_broadcast(&S.room);
    else if (S.ended == 1) { /* everything before the end was drained: hand trio END, once */
        S.ended = 2;
        batch[n++] = (rec_t){.op = OP_END};
    }
    pthread_mutex_unlock(&S.lock);
    if (n)
        atomic_fetch_add(&S.batches, 1);
    /* Each run of consecutive events becomes one record holding a flat list of ints: trio books a
     * run in one call without a tuple per event (the hot path: warm opens are nothing else). */
    static unsigned char folded[DRAIN_MAX]; /* a release folded into its open's visit (fold()): left out of the list */
    atomic_fetch_add_explicit(&S.visits, fold(batch, n, folded), memory_order_relaxed);
    size_t nout = 0;
    for (size_t i = 0; i < n; i++)
        if (batch[i].op < EV_OPEN || i == 0 || batch[i - 1].op < EV_OPEN)
            nout++;
    PyObject *out = PyList_New((Py_ssize_t)nout);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        rec_t *x = &batch[i];
        if (x->op >= EV_OPEN) {
            size_t j = i;
            while (j < n && batch[j].op >= EV_OPEN)
                j++;
            PyObject *t = out ? event_run(batch, i, j, folded) : NULL;
            if (t != NULL)
                PyList_SET_ITEM(out, (Py_ssize_t)k, t);
            k++; /* an event run lost to an allocation failure: out is dropped below */
            i = j - 1;
            continue;
        }
        PyObject *t = out ? Py_BuildValue("(iNKKKKKKKKy#y#IIII)", x->op, PyLong_FromVoidPtr(x->req), x->a[0],
                                          x->a[1], x->a[2], x->a[3], x->a[4], x->a[5], x->a[6], x->a[7], x->s1,
                                          (Py_ssize_t)x->n1, x->s2, (Py_ssize_t)x->n2, x->uid, x->gid, x->pid,
                                          x->umask)
                          : NULL;
        free(x->s1);
        free(x->s2);
        if (t == NULL) {
            /* answer what can no longer reach Python, so no request is left unanswered */
            if (x->req && x->op < EV_OPEN)
                fuse_reply_err(x->req, EIO);
            k++;
            continue;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)k, t);
        k++;
    }
    if (out == NULL)
        return NULL;
    for (size_t i = 0; i < nout; i++)
        if (PyList_GET_ITEM(out, (Py_ssize_t)i) == NULL) {
            Py_DECREF(out);
            return NULL;
        }
    return out;
}

/* fold_events(records) -> what drain() hands trio for `records`, a list of (op, inode, fh, own, pid):
 * each run of events (op EV_OPEN or EV_RELEASE) folded and made into one EV_BATCH record, any other
 * op (a forwarded request, which ends a run in the ring too) as (op,).  fold()'s rules, tested
 * without a mount (tests/test_front.py); it touches no session state, so it is safe at any time. */
static PyObject *py_fold_events(PyObject *m, PyObject *arg) {
    (void)m;
    PyObject *seq = PySequence_Fast(arg, "fold_events() takes a list of (op, inode, fh, own, pid)");
    if (seq == NULL)
        return NULL;
    size_t n = (size_t)PySequence_Fast_GET_SIZE(seq);
    rec_t *batch = calloc(n ? n : 1, sizeof *batch);
    unsigned char *folded = malloc(n ? n : 1);
    PyObject *out = NULL;
    if (batch == NULL || folded == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned long long ino, fh, own;
        unsigned int pid;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, (Py_ssize_t)i), "iKKKI", &batch[i].op, &ino, &fh, &own, &pid))
            goto done;
        batch[i].a[0] = ino, batch[i].a[1] = fh, batch[i].a[2] = own, batch[i].pid = pid;
    }
    fold(batch, n, folded);
    out = PyList_New(0);
    for (size_t i = 0; out && i < n; i++) {
        size_t j = i + 1;
        if (batch[i].op >= EV_OPEN)
            while (j < n && batch[j].op >= EV_OPEN)
                j++;
        PyObject *t = batch[i].op >= EV_OPEN ? event_run(batch, i, j, folded) : Py_BuildValue("(i)", batch[i].op);
        if (t == NULL || PyList_Append(out, t) < 0)
            Py_CLEAR(out);
        Py_XDECREF(t);
        i = j - 1;
    }
done:
    free(batch);
    free(folded);
    Py_DECREF(seq);
    return out;
}

static PyObject *py_reply_err(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *req;
    int err;
    if (!PyArg_ParseTuple(args, "Oi", &req, &err))
        return NULL;
    fuse_reply_err(as_req(req), err);
    Py_RETURN_NONE;
}

static PyObject *py_reply_none(PyObject *m, PyObject *req) {
    (void)m;
    fuse_reply_none(as_req(req));
    Py_RETURN_NONE;
}

static PyObject *py_reply_entry(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *req, *attrs;
    if (!PyArg_ParseTuple(args, "OO", &req, &attrs))
        return NULL;
    struct fuse_entry_param e;
    if (to_entry(attrs, &e) < 0)
        return NULL;
    fuse_reply_entry(as_req(req), &e);
    Py_RETURN_NONE;
}

static PyObject *py_reply_attr(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *req, *attrs;
    if (!PyArg_ParseTuple(args, "OO", &req, &attrs))
        return NULL;
    struct fuse_entry_param e;
    if (to_entry(attrs, &e) < 0)
        return NULL;
    fuse_reply_attr(as_req(req), &e.attr, e.attr_timeout);
    Py_RETURN_NONE;
}

static PyObject *py_reply_open(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *req;
    unsigned long long fh;
    int direct_io, keep_cache;
    if (!PyArg_ParseTuple(args, "OKpp", &req, &fh, &direct_io, &keep_cache))
        return NULL;
    struct fuse_file_info fi = {.fh = fh, .direct_io = direct_io, .keep_cache = keep_cache};
    fuse_reply_open(as_req(req), &fi);
    Py_RETURN_NONE;
}

static PyObject *py_reply_data(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *req;
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "Oy*", &req, &view))
        return NULL;
    fuse_req_t r = as_req(req);
    /* Without the GIL: the kernel may hold page locks a notify_store in a worker thread waits on. */
    Py_BEGIN_ALLOW_THREADS fuse_reply_buf(r, view.buf, (size_t)view.len);
    Py_END_ALLOW_THREADS PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

static PyObject *py_reply_write(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *req;
    unsigned long long n;
    if (!PyArg_ParseTuple(args, "OK", &req, &n))
        return NULL;
    fuse_reply_write(as_req(req), n);
    Py_RETURN_NONE;
}

static PyObject *py_reply_xattr(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *req;
    unsigned long long n;
    if (!PyArg_ParseTuple(args, "OK", &req, &n))
        return NULL;
    fuse_reply_xattr(as_req(req), n);
    Py_RETURN_NONE;
}

static PyObject *py_reply_readlink(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *req;
    const char *target;
    if (!PyArg_ParseTuple(args, "Oy", &req, &target))
        return NULL;
    fuse_reply_readlink(as_req(req), target);
    Py_RETURN_NONE;
}

static PyObject *py_reply_statfs(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *req;
    struct statvfs st = {0};
    unsigned long long bsize, frsize, blocks, bfree, bavail, files, ffree, favail, namemax;
    if (!PyArg_ParseTuple(args, "OKKKKKKKKK", &req, &bsize, &frsize, &blocks, &bfree, &bavail, &files, &ffree,
                          &favail, &namemax))
        return NULL;
    st.f_bsize = bsize;
    st.f_frsize = frsize;
    st.f_blocks = blocks;
    st.f_bfree = bfree;
    st.f_bavail = bavail;
    st.f_files = files;
    st.f_ffree = ffree;
    st.f_favail = favail;
    st.f_namemax = namemax;
    fuse_reply_statfs(as_req(req), &st);
    Py_RETURN_NONE;
}

static PyObject *py_dir_buffer(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *req;
    unsigned long long size;
    int plus;
    if (!PyArg_ParseTuple(args, "OKp", &req, &size, &plus))
        return NULL;
    DirBuf *d = PyObject_New(DirBuf, &DirBufType);
    if (d == NULL)
        return NULL;
    d->req = as_req(req);
    d->size = size;
    d->used = 0;
    d->plus = plus;
    d->buf = malloc(size ? size : 1);
    if (d->buf == NULL) {
        Py_DECREF(d);
        return PyErr_NoMemory();
    }
    return (PyObject *)d;
}

static PyObject *errno_result(int rc) {
    if (rc < 0) {
        errno = -rc;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

static PyObject *py_notify_store(PyObject *m, PyObject *args) {
    (void)m;
    unsigned long long ino, off;
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "KKy*", &ino, &off, &view))
        return NULL;
    if (S.se == NULL) {
        PyBuffer_Release(&view);
        return errno_result(-ENOTCONN);
    }
    struct fuse_bufvec bv = FUSE_BUFVEC_INIT((size_t)view.len);
    bv.buf[0].mem = view.buf;
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = fuse_lowlevel_notify_store(S.se, ino, (off_t)off, &bv, 0);
    Py_END_ALLOW_THREADS PyBuffer_Release(&view);
    return errno_result(rc);
}

static PyObject *py_invalidate_inode(PyObject *m, PyObject *args) {
    (void)m;
    unsigned long long ino;
    if (!PyArg_ParseTuple(args, "K", &ino))
        return NULL;
    if (S.se == NULL)
        return errno_result(-ENOTCONN);
    if (S.pages && ino < S.npages)
        atomic_store_explicit(&S.pages[ino], 0, memory_order_relaxed); /* before the pages go */
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = fuse_lowlevel_notify_inval_inode(S.se, ino, 0, 0);
    Py_END_ALLOW_THREADS return errno_result(rc);
}

static PyObject *py_invalidate_entry(PyObject *m, PyObject *args) {
    (void)m;
    unsigned long long parent;
    const char *name;
    Py_ssize_t nlen;
    if (!PyArg_ParseTuple(args, "Ky#", &parent, &name, &nlen))
        return NULL;
    if (S.se == NULL)
        return errno_result(-ENOTCONN);
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = fuse_lowlevel_notify_inval_entry(S.se, parent, name, (size_t)nlen);
    Py_END_ALLOW_THREADS return errno_result(rc);
}

static PyObject *py_set_pages(PyObject *m, PyObject *args) {
    (void)m;
    unsigned long long ino;
    int on;
    if (!PyArg_ParseTuple(args, "Kp", &ino, &on))
        return NULL;
    if (S.pages && ino < S.npages)
        atomic_store_explicit(&S.pages[ino], (unsigned char)on, memory_order_relaxed);
    Py_RETURN_NONE;
}

/* set_attrs(columns, blksize, attr_timeout): GETATTR of entries 0..n-1 answered from these 8
 * one-dimensional integer arrays of n items each (mode, nlink, uid, gid, size, atime_ns, mtime_ns,
 * ctime_ns), held until unmount().  Only before start(): see the memory lifetime rule above. */
static PyObject *py_set_attrs(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *cols;
    unsigned long long blksize;
    double attr_timeout;
    if (!PyArg_ParseTuple(args, "OKd", &cols, &blksize, &attr_timeout))
        return NULL;
    if (S.se == NULL || S.nthreads) {
        PyErr_SetString(PyExc_RuntimeError, "set_attrs: only after mount() and before start()");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(cols, "set_attrs: a sequence of 8 arrays");
    if (seq == NULL)
        return NULL;
    if (PySequence_Fast_GET_SIZE(seq) != NCOLS) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "set_attrs: 8 columns");
        return NULL;
    }
    attrs_release();
    Py_ssize_t n = -1;
    for (int c = 0; c < NCOLS; c++) {
        Py_buffer *b = &A.col[c];
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, c), b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
            goto fail;
        const char *f = b->format ? b->format : "B";
        if (*f == '<' || *f == '=' || *f == '@')
            f++;
        int known = f[0] && !f[1] && strchr("bBhHiIlLqQ", f[0]) != NULL;
        if (b->ndim != 1 || !known || (b->itemsize != 1 && b->itemsize != 2 && b->itemsize != 4 && b->itemsize != 8) ||
            (n >= 0 && b->shape[0] != n)) {
            PyErr_Format(PyExc_ValueError, "set_attrs: column %d is not a 1-d integer array of the others' length", c);
            goto fail;
        }
        A.is_signed[c] = strchr("bhilq", f[0]) != NULL;
        n = b->shape[0];
    }
    Py_DECREF(seq);
    A.blksize = blksize;
    A.attr_timeout = attr_timeout;
    A.n = (uint64_t)n;
    Py_RETURN_NONE;
fail:
    Py_DECREF(seq);
    attrs_release();
    return NULL;
}

/* Mark each of `dirs` (paths relative to the mount, "" the root) with FAN_EVENT_ON_CHILD in a
 * FAN_REPORT_FID group; -1 (errno set) when the group or a mark is refused. */
static int fan_fid_group(int root, char **dirs, Py_ssize_t ndirs) {
    int fd = fanotify_init(FAN_CLASS_NOTIF | FAN_REPORT_FID | FAN_UNLIMITED_QUEUE | FAN_CLOEXEC | FAN_NONBLOCK,
                           O_RDONLY | O_CLOEXEC | O_LARGEFILE);
    if (fd < 0)
        return -1;
    for (Py_ssize_t i = 0; i < ndirs; i++)
        if (fanotify_mark(fd, FAN_MARK_ADD, FAN_OPEN | FAN_CLOSE | FAN_EVENT_ON_CHILD, root,
                          dirs[i][0] ? dirs[i] : NULL) < 0) {
            int err = errno;
            close(fd);
            errno = err;
            return -1;
        }
    return fd;
}

/* watch(mountpoint, dirs): no_open mode.  Marks the directories holding files (FID, inode marks)
 * or else the mount (an fd per event), then arms ENOSYS for OPEN and starts the thread reading the
 * group.  Called from a worker thread once the session serves (the marks' path walks and
 * permission checks ask this daemon for lookups and attributes).  The marks come before the
 * arming: an open between the two is seen both as a request and as an event (booked twice, open
 * and release alike), never missed.  Returns whether events carry file handles (FID). */
static PyObject *py_watch(PyObject *m, PyObject *args) {
    (void)m;
    const char *mountpoint;
    PyObject *seq;
    if (!PyArg_ParseTuple(args, "sO", &mountpoint, &seq))
        return NULL;
    if (S.se == NULL || F.fd >= 0) {
        PyErr_SetString(PyExc_RuntimeError, "not mounted, or already watching");
        return NULL;
    }
    PyObject *fast = PySequence_Fast(seq, "dirs: a sequence of bytes");
    if (fast == NULL)
        return NULL;
    Py_ssize_t ndirs = PySequence_Fast_GET_SIZE(fast);
    char **dirs = calloc(ndirs ? (size_t)ndirs : 1, sizeof *dirs);
    if (dirs == NULL) {
        Py_DECREF(fast);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < ndirs; i++) {
        char *p;
        Py_ssize_t n;
        if (PyBytes_AsStringAndSize(PySequence_Fast_GET_ITEM(fast, i), &p, &n) < 0 ||
            (dirs[i] = strdup(p)) == NULL) {
            for (Py_ssize_t j = 0; j < i; j++)
                free(dirs[j]);
            free(dirs);
            Py_DECREF(fast);
            return PyErr_Occurred() ? NULL : PyErr_NoMemory();
        }
    }
    Py_DECREF(fast);
    int err = 0, fid = 0;
    Py_BEGIN_ALLOW_THREADS
    int fd = -1, stop_fd = -1;
    int root = open(mountpoint, O_RDONLY | O_DIRECTORY | O_CLOEXEC); /* the root's attributes asked now */
    if (root < 0)
        err = errno;
    if (!err && ndirs > 0) {
        fd = fan_fid_group(root, dirs, ndirs);
        fid = fd >= 0;
    }
    if (!err && fd < 0) {
        fd = fanotify_init(FAN_CLASS_NOTIF | FAN_UNLIMITED_QUEUE | FAN_CLOEXEC | FAN_NONBLOCK,
                           O_RDONLY | O_CLOEXEC | O_LARGEFILE);
        if (fd < 0)
            err = errno;
        else if (fanotify_mark(fd, FAN_MARK_ADD | FAN_MARK_MOUNT, FAN_OPEN | FAN_CLOSE, AT_FDCWD, mountpoint) < 0)
            err = errno;
    }
    if (root >= 0)
        close(root);
    if (!err && (stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0)
        err = errno;
    if (!err) {
        F.fd = fd;
        F.stop_fd = stop_fd;
        F.fid = fid;
        atomic_store_explicit(&F.armed, 1, memory_order_release);
        err = pthread_create(&F.thread, NULL, fan_loop, NULL);
        if (!err)
            F.running = 1;
        else
            fan_stop();
    } else {
        if (fd >= 0)
            close(fd);
        if (stop_fd >= 0)
            close(stop_fd);
    }
    Py_END_ALLOW_THREADS for (Py_ssize_t i = 0; i < ndirs; i++) free(dirs[i]);
    free(dirs);
    if (err) {
        errno = err;
        return PyErr_SetFromErrnoWithFilename(PyExc_OSError, mountpoint);
    }
    return PyBool_FromLong(fid);
}

static PyObject *py_stats(PyObject *m, PyObject *noargs) {
    (void)m, (void)noargs;
#define U(x) (unsigned long long)atomic_load(&(x))
    return Py_BuildValue("{sKsKsKsKsKsKsKsKsKsKsKsKsKsi}", "batches", U(S.batches), "visits", U(S.visits),
                         "native_opens", U(S.native_opens),
                         "native_releases", U(S.native_releases), "native_ioctls", U(S.native_ioctls),
                         "native_getattrs", U(S.native_getattrs), "forwarded",
                         U(S.forwarded), "ring_full", U(S.ring_full), "observed_opens", U(F.opens),
                         "observed_releases", U(F.releases), "own_opens_dropped", U(F.own), "observed_overflows",
                         U(F.overflows), "opens_answered_enosys", U(F.enosys), "no_open",
                         atomic_load(&F.armed) ? (F.fid ? 2 : 1) : 0);
#undef U
}

static PyMethodDef methods[] = {
    {"mount", py_mount, METH_VARARGS, "mount(mountpoint, options, inodes, ring=4096, no_open=False) -> wake eventfd (not served yet)"},
    {"start", py_start, METH_NOARGS, "start the receive threads"},
    {"stop", py_stop, METH_NOARGS, "end the session from any thread: the receive threads stop, run() sees END"},
    {"unmount", py_unmount, METH_NOARGS, "join the threads, answer what is left, unmount, free"},
    {"drain", py_drain, METH_O, "drain(most) -> up to `most` ring records in order, each run of events as one EV_BATCH record (reads the wake eventfd first)"},
    {"fold_events", py_fold_events, METH_O, "fold_events(records) -> drain()'s records for (op, inode, fh, own, pid) tuples, runs of events folded (tests)"},
    {"reply_err", py_reply_err, METH_VARARGS, "reply_err(req, errno); 0 is success without data"},
    {"reply_none", py_reply_none, METH_O, "reply_none(req)"},
    {"reply_entry", py_reply_entry, METH_VARARGS, "reply_entry(req, attrs)"},
    {"reply_attr", py_reply_attr, METH_VARARGS, "reply_attr(req, attrs)"},
    {"reply_open", py_reply_open, METH_VARARGS, "reply_open(req, fh, direct_io, keep_cache)"},
    {"reply_data", py_reply_data, METH_VARARGS, "reply_data(req, buffer) (GIL released)"},
    {"reply_write", py_reply_write, METH_VARARGS, "reply_write(req, count)"},
    {"reply_xattr", py_reply_xattr, METH_VARARGS, "reply_xattr(req, size)"},
    {"reply_readlink", py_reply_readlink, METH_VARARGS, "reply_readlink(req, target)"},
    {"reply_statfs", py_reply_statfs, METH_VARARGS, "reply_statfs(req, bsize, frsize, blocks, bfree, bavail, ...)"},
    {"dir_buffer", py_dir_buffer, METH_VARARGS, "dir_buffer(req, size, plus) -> DirBuffer"},
    {"notify_store", py_notify_store, METH_VARARGS, "notify_store(inode, offset, data) (GIL released)"},
    {"invalidate_inode", py_invalidate_inode, METH_VARARGS, "invalidate_inode(inode) (GIL released)"},
    {"invalidate_entry", py_invalidate_entry, METH_VARARGS, "invalidate_entry(parent, name) (GIL released)"},
    {"set_pages", py_set_pages, METH_VARARGS, "set_pages(inode, on): its opens are answered natively"},
    {"set_attrs", py_set_attrs, METH_VARARGS, "set_attrs(columns, blksize, attr_timeout): GETATTR of snapshot entries answered natively (before start())"},
    {"watch", py_watch, METH_VARARGS, "watch(mountpoint, dirs) -> fid: no_open mode: fanotify marks, then OPEN answered ENOSYS (GIL released)"},
    {"stats", py_stats, METH_NOARGS, "counters of what was answered natively and forwarded"},
    {NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", "libfuse3 low-level session for seerfs", -1,
                                    methods};

PyMODINIT_FUNC PyInit__native(void) {
    if (PyType_Ready(&AttrsType) < 0 || PyType_Ready(&DirBufType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&AttrsType);
    Py_INCREF(&DirBufType);
    if (PyModule_AddObject(m, "EntryAttributes", (PyObject *)&AttrsType) < 0 ||
        PyModule_AddObject(m, "DirBuffer", (PyObject *)&DirBufType) < 0)
        return NULL;
#define C(name) PyModule_AddIntConstant(m, #name, name)
    C(OP_END); C(OP_INIT); C(OP_LOOKUP); C(OP_GETATTR); C(OP_SETATTR); C(OP_READLINK); C(OP_MKNOD);
    C(OP_MKDIR); C(OP_UNLINK); C(OP_RMDIR); C(OP_SYMLINK); C(OP_RENAME); C(OP_LINK); C(OP_OPEN);
    C(OP_READ); C(OP_WRITE); C(OP_RELEASE); C(OP_OPENDIR); C(OP_READDIR); C(OP_READDIRPLUS);
    C(OP_RELEASEDIR); C(OP_STATFS); C(OP_SETXATTR); C(OP_GETXATTR); C(OP_LISTXATTR);
    C(OP_REMOVEXATTR); C(OP_CREATE); C(EV_OPEN); C(EV_RELEASE); C(EV_BATCH); C(EV_VISIT); C(NATIVE_FH_BASE);
    C(FUSE_SET_ATTR_SIZE); C(FUSE_SET_ATTR_MODE); C(FUSE_SET_ATTR_UID); C(FUSE_SET_ATTR_GID);
#undef C
    return m;
}
