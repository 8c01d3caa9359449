/* emm_fork: what a C program that forks gets from emm.
 *
 *   emm_fork [pool|default|hostonly]
 *
 * 1. A child forked before CUDA was first used is an ordinary process: it makes
 *    its own manager and allocates.
 * 2. A child forked after the parent initialised CUDA through emm gets
 *    EMM_ERR_FORKED from every call, with a message that says how to start
 *    workers instead, and never touches the parent's pool (nothing is allocated,
 *    freed or destroyed there; the real driver refuses CUDA in such a child).
 * 3. The parent's manager works on: the block it held is still counted, and it
 *    allocates and frees.
 *
 * Prints "emm_fork: done" and exits 0 when all of that held; otherwise says what
 * did not and exits 1 (3 when no driver could be loaded). */
#include <emm.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static int failures = 0;

static void check(int ok, const char *what) {
  if (!ok) {
    char msg[512];
    emm_last_error(msg, sizeof msg);
    fprintf(stderr, "emm_fork: FAILED: %s (last error: %s)\n", what, msg);
    failures++;
  }
}

/* Waits for `pid` and returns its exit status, or -1 when it did not exit. */
static int wait_exit(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

/* The child of step 1: a fresh process that may use CUDA. */
static int fresh_child(const char *name) {
  struct emm_manager *m = NULL;
  uint64_t p = 0;
  if (emm_manager_create(name, 0, &m) != EMM_OK) return 10;
  if (emm_alloc(m, 1 << 20, NULL, &p) != EMM_OK || p == 0) return 11;
  if (emm_free(m, p, NULL) != EMM_OK) return 12;
  emm_manager_destroy(m);
  return 0;
}

/* The child of step 2: everything is refused with EMM_ERR_FORKED. */
static int forked_child(struct emm_manager *m, uint64_t held) {
  uint64_t p = 0;
  struct emm_stats st;
  struct emm_manager *m2 = NULL;
  char msg[512];
  if (emm_alloc(m, 1 << 20, NULL, &p) != EMM_ERR_FORKED || p != 0) return 20;
  emm_last_error(msg, sizeof msg);
  if (strstr(msg, "forked") == NULL || strstr(msg, "spawn") == NULL) return 21;
  if (emm_free(m, held, NULL) != EMM_ERR_FORKED) return 22;
  if (emm_get_stats(m, &st) != EMM_ERR_FORKED) return 23;
  if (emm_manager_create("pool", 0, &m2) != EMM_ERR_FORKED || m2 != NULL) return 24;
  if (emm_last_error_code() != EMM_ERR_FORKED) return 25;
  emm_manager_destroy(m); /* refused too: the handle is the parent's */
  return 0;
}

int main(int argc, char **argv) {
  const char *name = argc > 1 ? argv[1] : "pool";
  struct emm_manager *m = NULL;
  struct emm_stats st;
  uint64_t held = 0, p = 0;
  pid_t pid;
  int rc;

  fflush(stdout);
  pid = fork();
  if (pid == 0) _exit(fresh_child(name));
  rc = wait_exit(pid);
  check(rc == 0, "a child forked before CUDA was used makes its own manager and allocates");
  if (rc != 0) fprintf(stderr, "emm_fork: that child exited with %d\n", rc);

  if (emm_manager_create(name, 0, &m) != EMM_OK) {
    char msg[512];
    emm_last_error(msg, sizeof msg);
    fprintf(stderr, "emm_fork: emm_manager_create(%s): %s\n", name, msg);
    return 3;
  }
  check(emm_alloc(m, 4 << 20, NULL, &held) == EMM_OK, "the parent allocates 4 MiB");
  check(emm_alloc(m, 2 << 20, NULL, &p) == EMM_OK && emm_free(m, p, NULL) == EMM_OK,
        "the parent allocates and frees 2 MiB (the pool caches it)");

  fflush(stdout);
  pid = fork();
  if (pid == 0) _exit(forked_child(m, held));
  rc = wait_exit(pid);
  check(rc == 0, "a child forked after CUDA was initialised gets EMM_ERR_FORKED everywhere");
  if (rc != 0) fprintf(stderr, "emm_fork: that child exited with %d\n", rc);

  check(emm_get_stats(m, &st) == EMM_OK && st.allocated_bytes == (4u << 20),
        "the parent's manager still counts its 4 MiB block, and only it");
  check(emm_alloc(m, 8 << 20, NULL, &p) == EMM_OK && emm_free(m, p, NULL) == EMM_OK,
        "the parent allocates and frees after the fork");
  check(emm_free(m, held, NULL) == EMM_OK, "the parent frees its block");
  check(emm_get_stats(m, &st) == EMM_OK && st.allocated_bytes == 0,
        "nothing is left allocated");
  emm_manager_destroy(m);
  if (failures) return 1;
  printf("emm_fork: done (%s)\n", name);
  return 0;
}
