/* The machine's own ceiling for `emm bench`'s thread scaling: the same shape of
 * work (4,000,000 allocate+free pairs a thread, sizes 256 B, 4 KiB, 64 KiB and
 * 1 MiB in turn, no sharing between threads) through glibc's malloc, which keeps an
 * arena per thread, on 1 and on 16 threads, clocked from a barrier to the last
 * thread's end as the bench does; and a loop that touches no memory at all. What 16 threads give over one here is what the
 * cores (all-core clock, shared caches) allow any allocator without contention.
 *
 *   gcc -O2 -pthread -o ts python/gpu/probes/thread_scaling.c && ./ts
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define PER_THREAD 4000000L
static pthread_barrier_t ready, done;
static volatile size_t sink;

static int pure;

static void *work(void *arg) {
    long t = (long)arg;
    if (pure) {
        /* No memory at all: a xorshift chain, the cores' own scaling. */
        pthread_barrier_wait(&ready);
        unsigned long x = (unsigned long)t + 88172645463325252UL;
        for (long i = 0; i < PER_THREAD * 16; i++) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        }
        sink += x;
        pthread_barrier_wait(&done);
        return NULL;
    }
    static const size_t sizes[4] = {256, 4096, 65536, 1 << 20};
    pthread_barrier_wait(&ready);
    size_t acc = 0;
    for (long i = 0; i < PER_THREAD; i++) {
        char *p = malloc(sizes[(i + t) % 4]);
        p[0] = (char)i;
        acc += (size_t)p[0];
        free(p);
    }
    sink += acc;
    pthread_barrier_wait(&done);
    return NULL;
}

static double run(int n) {
    pthread_t th[64];
    struct timespec a, b;
    pthread_barrier_init(&ready, NULL, n + 1);
    pthread_barrier_init(&done, NULL, n + 1);
    for (long t = 0; t < n; t++) pthread_create(&th[t], NULL, work, (void *)t);
    pthread_barrier_wait(&ready);
    clock_gettime(CLOCK_MONOTONIC, &a);
    pthread_barrier_wait(&done);
    clock_gettime(CLOCK_MONOTONIC, &b);
    for (int t = 0; t < n; t++) pthread_join(th[t], NULL);
    pthread_barrier_destroy(&ready);
    pthread_barrier_destroy(&done);
    double s = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
    return (double)n * PER_THREAD / s;
}

int main(void) {
    for (pure = 0; pure < 2; pure++) {
        run(1);
        double one = run(1), sixteen = run(16);
        printf("%s: 1 thread %.1f M/s, 16 threads %.1f M/s (%.1fx)\n",
               pure ? "xorshift loop, no memory (the cores' own scaling; M loops of 16 steps)"
                    : "glibc malloc+free, same shape as emm bench (M pairs)",
               one / 1e6, sixteen / 1e6, sixteen / one);
    }
    return 0;
}
