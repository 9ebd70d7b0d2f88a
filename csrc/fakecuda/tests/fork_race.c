/*
 * fork_race LIBCUDA N: a parent and its fork child each queue N one-block kernels behind one long
 * kernel on device 0, as fast as C can; prints {"ms": ..., "expected": ...}: the simulated time
 * from the long kernel's end to the parent's last kernel's end, and what it is when no launch was
 * lost (2N + 1 blocks). A lost one means the two processes' launches did not exclude each other.
 * Needs FAKE_NVML_PROFILE, FAKE_GPU_STATE, FAKE_GPU_NS_PER_BLOCK=1000.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

typedef int (*get_version_t)(int *);
typedef int (*init_t)(unsigned int);
typedef int (*retain_t)(void **, int);
typedef int (*set_current_t)(void *);
typedef int (*load_t)(void **, const void *);
typedef int (*get_function_t)(void **, void *, const char *);
typedef int (*launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                        void **, void **);
typedef int (*event_create_t)(void **, unsigned int);
typedef int (*event_record_t)(void *, void *);
typedef int (*event_sync_t)(void *);
typedef int (*elapsed_t)(float *, void *, void *);

static void *lib;

static void *sym(const char *name) {
    void *p = dlsym(lib, name);
    if (p == NULL) {
        fprintf(stderr, "fork_race: %s: %s\n", name, dlerror());
        exit(2);
    }
    return p;
}

#define CHECK(call)                                                                                \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != 0) {                                                                            \
            fprintf(stderr, "fork_race: %s: %d\n", #call, rc_);                                    \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

int main(int argc, char **argv) {
    if (argc != 3 || (lib = dlopen(argv[1], RTLD_NOW)) == NULL) {
        fprintf(stderr, "usage: fork_race LIBCUDA N\n");
        return 2;
    }
    long n = strtol(argv[2], NULL, 10);
    launch_t launch = (launch_t)sym("cuLaunchKernel");
    int version;
    CHECK(((get_version_t)sym("cuDriverGetVersion"))(&version)); /* maps the state before fork */
    int go[2], done[2];
    if (pipe(go) < 0 || pipe(done) < 0) return 1;
    pid_t pid = fork();
    if (pid < 0) return 1;
    void *ctx, *module, *fn;
    CHECK(((init_t)sym("cuInit"))(0));
    CHECK(((retain_t)sym("cuDevicePrimaryCtxRetain"))(&ctx, 0));
    CHECK(((set_current_t)sym("cuCtxSetCurrent"))(ctx));
    CHECK(((load_t)sym("cuModuleLoadData"))(&module, ".version 8.0\n.target sm_80\n.visible .entry k()\n{ ret; }\n"));
    CHECK(((get_function_t)sym("cuModuleGetFunction"))(&fn, module, "k"));
    char c;
    if (pid == 0) {
        if (read(go[0], &c, 1) != 1) _exit(1);
        for (long i = 0; i < n; i++) CHECK(launch(fn, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
        _exit(write(done[1], "x", 1) == 1 ? 0 : 1);
    }
    CHECK(launch(fn, 1000000, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL)); /* 1 s: the rest queues behind it */
    void *start, *end;
    CHECK(((event_create_t)sym("cuEventCreate"))(&start, 0));
    CHECK(((event_create_t)sym("cuEventCreate"))(&end, 0));
    CHECK(((event_record_t)sym("cuEventRecord"))(start, NULL));
    if (write(go[1], "x", 1) != 1) return 1;
    for (long i = 0; i < n; i++) CHECK(launch(fn, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
    int status;
    if (read(done[0], &c, 1) != 1 || waitpid(pid, &status, 0) != pid || status != 0) return 1;
    CHECK(launch(fn, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
    CHECK(((event_record_t)sym("cuEventRecord"))(end, NULL));
    CHECK(((event_sync_t)sym("cuEventSynchronize"))(end));
    float ms;
    CHECK(((elapsed_t)sym("cuEventElapsedTime"))(&ms, start, end));
    printf("{\"ms\": %.4f, \"expected\": %.4f}\n", ms, (2.0 * (double)n + 1) / 1000);
    return 0;
}
