/* The pod sandbox's process: holds the pod's namespaces open and does nothing
 * else. Written here (no registry to pull registry.k8s.io/pause from); it does
 * what that image's pause does: exit on SIGINT/SIGTERM, reap children it
 * inherits as PID 1, sleep otherwise. Built static by hack/node/images.sh. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void die(int sig) { _exit(128 + sig); }

static void reap(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(void) {
  struct sigaction term = {.sa_handler = die}, chld = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
  sigaction(SIGINT, &term, NULL);
  sigaction(SIGTERM, &term, NULL);
  sigaction(SIGCHLD, &chld, NULL);
  for (;;) pause();
}
