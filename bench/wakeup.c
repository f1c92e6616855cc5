/* How long a thread takes to wake another, on this machine: two threads
 * pass a byte back and forth through two pipes, each blocked in read() while
 * the other runs. Prints the median round trip, in microseconds, of 5 runs of
 * N round trips, with the second thread on CPU B and the first on CPU A.
 *
 *   cc -O2 -pthread -o wakeup wakeup.c && ./wakeup A B [N]
 *
 * run.sh reports it beside the results: on a virtual machine, waking an idle
 * virtual CPU can cost tens of microseconds, which bounds any server that
 * sleeps between requests (see bench/README.md). */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static int ping[2], pong[2], cpu_b, n;

static int pin(int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static void *echo(void *arg)
{
    char c;
    (void) arg;
    if (pin(cpu_b) != 0) exit(2);
    for (;;) {
        if (read(ping[0], &c, 1) != 1) return NULL;
        if (write(pong[1], &c, 1) != 1) return NULL;
    }
}

static double run(void)
{
    struct timespec t0, t1;
    char c = 'x';
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < n; i++) {
        if (write(ping[1], &c, 1) != 1 || read(pong[0], &c, 1) != 1) exit(1);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / n / 1e3;
}

int main(int argc, char **argv)
{
    pthread_t t;
    double r[5], x;
    if (argc < 3) {
        fprintf(stderr, "usage: %s CPU_A CPU_B [ROUND_TRIPS]\n", argv[0]);
        return 2;
    }
    cpu_b = atoi(argv[2]);
    n = argc > 3 ? atoi(argv[3]) : 2000;
    if (n < 1 || pipe(ping) != 0 || pipe(pong) != 0 || pin(atoi(argv[1])) != 0) return 2;
    if (pthread_create(&t, NULL, echo, NULL) != 0) return 2;
    run(); /* warm-up */
    for (int i = 0; i < 5; i++) {
        r[i] = run();
        for (int j = i; j > 0 && r[j - 1] > r[j]; j--) { x = r[j]; r[j] = r[j - 1]; r[j - 1] = x; }
    }
    printf("%.1f\n", r[2]);
    return 0;
}
