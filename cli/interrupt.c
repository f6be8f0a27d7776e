/* interrupt.c — what SIGINT, SIGTERM, SIGHUP and SIGPIPE do in the attn
 * command (interrupt.h). */
#define _POSIX_C_SOURCE 200809L
#include "interrupt.h"

#include "cli.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

static const int caught[] = {SIGINT, SIGTERM, SIGHUP, SIGPIPE};
#define NUM_CAUGHT (sizeof caught / sizeof caught[0])

/* What the handler reads. The list changes only on the main thread with the
 * signals held (cli_interrupt_hold), and the handler acts only on the main
 * thread, so it never sees a list half changed. */
static const char **tracked;
static size_t tracked_count, tracked_capacity;
static const char *tracked_dir;

static volatile sig_atomic_t cooperating, received;
static pthread_t main_thread;

static int hold_depth;
static sigset_t mask_before_hold;

static void caught_set(sigset_t *set) {
    sigemptyset(set);
    for (size_t i = 0; i < NUM_CAUGHT; i++) sigaddset(set, caught[i]);
}

/* The immediate path: async-signal-safe calls only. */
static void remove_temporaries_and_die(int sig) {
    for (size_t i = 0; i < tracked_count; i++) unlink(tracked[i]);
    if (tracked_dir) rmdir(tracked_dir);
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
    raise(sig);
    /* The handler runs with sig blocked: the raised one is pending, and its
     * default action ends the process as soon as it is unblocked. */
    sigset_t only;
    sigemptyset(&only);
    sigaddset(&only, sig);
    pthread_sigmask(SIG_UNBLOCK, &only, NULL);
}

static void on_signal(int sig) {
    int saved_errno = errno;
    if (!pthread_equal(pthread_self(), main_thread)) {
        /* A worker of the library's pool: the main thread acts on it, at
         * once or, while it holds the signals, when it releases them. */
        pthread_kill(main_thread, sig);
    } else if (cooperating && !received) {
        received = sig;
    } else if (sig == SIGPIPE && (cooperating || received)) {
        /* stopping already, or stopped and finishing: each later write to
         * the closed pipe raises it again, and fails with EPIPE */
    } else {
        remove_temporaries_and_die(sig);
    }
    errno = saved_errno;
}

void cli_interrupt_install(void) {
    main_thread = pthread_self();
    struct sigaction sa = {.sa_handler = on_signal, .sa_flags = SA_RESTART};
    /* one signal at a time on the thread that takes it */
    caught_set(&sa.sa_mask);
    for (size_t i = 0; i < NUM_CAUGHT; i++) {
        struct sigaction before;
        if (sigaction(caught[i], NULL, &before) == 0 && before.sa_handler == SIG_IGN) continue;
        sigaction(caught[i], &sa, NULL);
    }
}

void cli_interrupt_hold(void) {
    sigset_t set, before;
    caught_set(&set);
    pthread_sigmask(SIG_BLOCK, &set, &before);
    if (hold_depth++ == 0) mask_before_hold = before;
}

void cli_interrupt_release(void) {
    if (hold_depth == 0) return;
    if (--hold_depth == 0) pthread_sigmask(SIG_SETMASK, &mask_before_hold, NULL);
}

bool cli_interrupt_track(const char *path) {
    bool ok = true;
    cli_interrupt_hold();
    if (tracked_count == tracked_capacity) {
        size_t capacity = tracked_capacity ? 2 * tracked_capacity : 16;
        const char **grown = realloc(tracked, capacity * sizeof *grown);
        if (grown) tracked = grown, tracked_capacity = capacity;
        else ok = false;
    }
    if (ok) tracked[tracked_count++] = path;
    cli_interrupt_release();
    return ok;
}

void cli_interrupt_track_dir(const char *dir) {
    cli_interrupt_hold();
    tracked_dir = dir;
    cli_interrupt_release();
}

void cli_interrupt_untrack(const char *path) {
    if (!path) return;
    cli_interrupt_hold();
    for (size_t i = tracked_count; i-- > 0;) {
        if (tracked[i] != path) continue;
        tracked[i] = tracked[--tracked_count];
        break;
    }
    if (tracked_count == 0) {
        free(tracked);
        tracked = NULL;
        tracked_capacity = 0;
    }
    cli_interrupt_release();
}

void cli_interrupt_cooperate(bool on) { cooperating = on; }

int cli_interrupt_pending(void) { return received; }

int cli_interrupt_finish(const char *command, const char *done, int rc) {
    cooperating = 0;
    int sig = received;
    if (!sig || rc != CLI_OK) return rc;
    cli_note("%s: interrupted (%s) as it finished: %s", command, cli_interrupt_name(sig), done);
    return cli_interrupt_status(sig);
}

const char *cli_interrupt_name(int sig) {
    return sig == SIGINT    ? "SIGINT"
           : sig == SIGTERM ? "SIGTERM"
           : sig == SIGHUP  ? "SIGHUP"
           : sig == SIGPIPE ? "SIGPIPE"
                            : "a signal";
}

int cli_interrupt_status(int sig) { return 128 + sig; }
