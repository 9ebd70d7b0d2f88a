/* The shared bucket file with real processes: creation and in-place rebuild of a bad header, the
 * state kept across reopen, no lost update when several processes charge and refill the same
 * mapped count, one refill per period however many processes race for it, and sampler election by
 * the OFD lock: exactly one holder, taken over when the holder is SIGKILLed, not kept alive by a
 * forked child's inherited descriptor. */
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "core_bucket.h"
#include "core_shared.h"

static char dir[64];

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Removes the previous test's directory (its files and the .sm_node subdirectory). */
static void remove_dir(void)
{
    if (!dir[0])
        return;
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    dir[0] = 0;
}

static void fresh_dir(void)
{
    remove_dir();
    snprintf(dir, sizeof(dir), "/tmp/core_shared.XXXXXX");
    CHECK(mkdtemp(dir) != NULL);
}

static void test_create_and_rebuild(void)
{
    fresh_dir();
    char sub[128], err[256] = "";
    snprintf(sub, sizeof(sub), "%s/.sm_node", dir); /* created on open */
    struct core_shared s;
    CHECK_INT(core_shared_open(&s, sub, err, sizeof(err)), 0);
    CHECK_INT(s.node->magic, VGPU_SM_MAGIC);
    CHECK_MEM((const char *)s.node, 4, "SMND", 4);
    CHECK_INT(s.node->layout, 3);
    CHECK_INT(s.node->size, VGPU_SM_STRUCT_SIZE);
    CHECK_INT(s.node->count, 16);
    struct vgpu_sm_device *d = core_shared_device(&s, 3, 1000, 30, 0, 100);
    CHECK(d == &s.node->devices[3]);
    CHECK_INT(d->tokens, 100);
    CHECK_INT(d->ceiling, 1000);
    CHECK(core_shared_device(&s, 16, 1000, 30, 0, 100) == NULL);
    d->tokens = 77;
    core_shared_close(&s);

    struct core_shared again;
    CHECK_INT(core_shared_open(&again, sub, err, sizeof(err)), 0);
    CHECK_INT(again.node->devices[3].tokens, 77); /* a valid file is kept */
    CHECK_INT(core_shared_device(&again, 3, 5000, 60, 0, 999)->ceiling, 1000); /* set up once */
    again.node->layout = 2;                       /* a foreign layout */
    core_shared_close(&again);
    CHECK_INT(core_shared_open(&again, sub, err, sizeof(err)), 0);
    CHECK_INT(again.node->layout, 3);
    CHECK_INT(again.node->devices[3].tokens, 0);  /* rebuilt */
    CHECK_INT(again.node->devices[3].active, 0);
    core_shared_close(&again);

    char file[160];
    snprintf(file, sizeof(file), "%s/sm_node.config", sub);
    int fd = open(file, O_WRONLY | O_TRUNC); /* truncated by someone: resized and rebuilt */
    CHECK(fd >= 0);
    close(fd);
    CHECK_INT(core_shared_open(&again, sub, err, sizeof(err)), 0);
    CHECK_INT(again.node->magic, VGPU_SM_MAGIC);
    core_shared_close(&again);

    struct core_shared bad;
    CHECK_INT(core_shared_open(&bad, "/proc/no/such/dir", err, sizeof(err)), -1);
    CHECK(strstr(err, "/proc/no/such/dir") != NULL);
}

#define PROCS 4
#define CHARGES 20000

/* PROCS children charge 3 blocks CHARGES times each while one refills 2 tokens CHARGES times (the
 * cap out of reach): the count ends at exactly start - 3 x admitted + 2 x CHARGES. */
static void test_processes_no_lost_update(void)
{
    fresh_dir();
    char err[256];
    struct core_shared s;
    CHECK_INT(core_shared_open(&s, dir, err, sizeof(err)), 0);
    struct vgpu_sm_device *d = core_shared_device(&s, 0, INT64_C(1) << 50, 30, 0, 1000);
    long *admitted = mmap(NULL, sizeof(long) * PROCS, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    pid_t kids[PROCS + 1];
    for (int i = 0; i <= PROCS; i++) {
        kids[i] = fork();
        if (kids[i] == 0) {
            struct core_shared mine;
            if (core_shared_open(&mine, dir, err, sizeof(err)) < 0)
                _exit(2);
            struct vgpu_sm_device *md = core_shared_device(&mine, 0, 1, 1, 0, 1);
            for (int n = 0; n < CHARGES; n++) {
                if (i == PROCS)
                    core_bucket_refill(&md->tokens, 2, md->ceiling);
                else if (core_bucket_try_charge(&md->tokens, 3))
                    admitted[i]++;
            }
            _exit(0);
        }
    }
    for (int i = 0; i <= PROCS; i++) {
        int st;
        waitpid(kids[i], &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    long total = 0;
    for (int i = 0; i < PROCS; i++)
        total += admitted[i];
    CHECK(total > 0);
    CHECK_INT(d->tokens, 1000 - 3 * total + 2 * CHARGES);
    munmap(admitted, sizeof(long) * PROCS);
    core_shared_close(&s);
}

/* PROCS processes try to refill 1 token as fast as they can for 450 ms: the refills counted by the
 * winners equal the tokens added and number at most 450/90 + 1, not PROCS times that. */
static void test_refill_elected_once_per_period(void)
{
    fresh_dir();
    char err[256];
    struct core_shared s;
    CHECK_INT(core_shared_open(&s, dir, err, sizeof(err)), 0);
    struct vgpu_sm_device *d = core_shared_device(&s, 1, INT64_C(1) << 50, 30, 0, 0);
    long *won = mmap(NULL, sizeof(long) * PROCS, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    pid_t kids[PROCS];
    for (int i = 0; i < PROCS; i++) {
        kids[i] = fork();
        if (kids[i] == 0) {
            struct core_shared mine;
            if (core_shared_open(&mine, dir, err, sizeof(err)) < 0)
                _exit(2);
            struct vgpu_sm_device *md = &mine.node->devices[1];
            uint64_t end = now_ns() + 450000000ull;
            for (uint64_t t; (t = now_ns()) < end;)
                if (core_shared_refill(md, t, 1, INT64_C(1) << 50, NULL))
                    won[i]++;
            _exit(0);
        }
    }
    long total = 0;
    for (int i = 0; i < PROCS; i++) {
        int st;
        waitpid(kids[i], &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        total += won[i];
    }
    printf("refills in 450 ms by %d racing processes: %ld\n", PROCS, total);
    CHECK(total >= 1 && total <= 6);
    CHECK_INT(d->tokens, total);
    munmap(won, sizeof(long) * PROCS);
    core_shared_close(&s);
}

/* A child that becomes the sampler and waits; it writes '1' to the pipe once it holds the lock. */
static pid_t sampler_child(int wfd)
{
    pid_t pid = fork();
    if (pid == 0) {
        char err[256];
        struct core_shared mine;
        if (core_shared_open(&mine, dir, err, sizeof(err)) < 0)
            _exit(2);
        while (!core_shared_try_sampler(&mine))
            usleep(1000);
        core_shared_heartbeat(&mine, now_ns());
        if (write(wfd, "1", 1) != 1)
            _exit(3);
        pause();
        _exit(0);
    }
    return pid;
}

static void test_sampler_election_and_takeover(void)
{
    fresh_dir();
    char err[256], c;
    struct core_shared s;
    CHECK_INT(core_shared_open(&s, dir, err, sizeof(err)), 0);
    CHECK(core_shared_sampler_stale(&s, now_ns(), 1000000000ull)); /* never had one */
    int p[2];
    CHECK_INT(pipe(p), 0);
    pid_t first = sampler_child(p[1]);
    CHECK_INT(read(p[0], &c, 1), 1);
    CHECK_INT(s.node->sampler_pid, first);
    CHECK(!core_shared_sampler_stale(&s, now_ns(), 1000000000ull));
    CHECK(!core_shared_try_sampler(&s)); /* held by the first child */
    pid_t second = sampler_child(p[1]); /* waits for the lock */
    usleep(50000);
    CHECK_INT(s.node->sampler_pid, first);
    kill(first, SIGKILL);
    waitpid(first, NULL, 0);
    CHECK_INT(read(p[0], &c, 1), 1); /* the kernel released the lock: the second took over */
    CHECK_INT(s.node->sampler_pid, second);
    kill(second, SIGKILL);
    waitpid(second, NULL, 0);

    /* We hold it now; a forked child that drops its inherited descriptor does not keep it alive
     * after we let go, and cannot take it while we hold it. */
    CHECK(core_shared_try_sampler(&s));
    pid_t kid = fork();
    if (kid == 0) {
        core_shared_after_fork(&s);
        _exit(core_shared_try_sampler(&s) ? 1 : 0);
    }
    int st;
    waitpid(kid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    int hold[2];
    CHECK_INT(pipe(hold), 0);
    kid = fork();
    if (kid == 0) { /* inherits our lock descriptor, drops it, then lives on */
        core_shared_after_fork(&s);
        if (write(hold[1], "1", 1) != 1)
            _exit(3);
        pause();
        _exit(0);
    }
    CHECK_INT(read(hold[0], &c, 1), 1);
    core_shared_close(&s); /* we let go while the child still runs */
    struct core_shared other;
    CHECK_INT(core_shared_open(&other, dir, err, sizeof(err)), 0);
    CHECK(core_shared_try_sampler(&other));
    kill(kid, SIGKILL);
    waitpid(kid, NULL, 0);
    core_shared_close(&other);
}

int main(void)
{
    RUN(test_create_and_rebuild);
    RUN(test_processes_no_lost_update);
    RUN(test_refill_elected_once_per_period);
    RUN(test_sampler_election_and_takeover);
    remove_dir();
    return check_summary("test_core_shared");
}
