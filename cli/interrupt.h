/*
 * interrupt.h — Ctrl-C (SIGINT), SIGTERM, SIGHUP and SIGPIPE (a reader of
 * its output gone: `attn pretrain ... | head`) in the attn command: no
 * temporary is left behind, and a long run stops where its work can be
 * kept. From the first signal a polling command takes on, SIGPIPE (which
 * each later write to a closed pipe raises) is ignored: such writes fail
 * with EPIPE, and a run that SIGPIPE stopped does not report them.
 *
 * main() installs the handlers (cli_interrupt_install); cli_main does not,
 * so the fuzz target and attn-bench keep the default actions. Then:
 *   - a command that polls declares it (cli_interrupt_cooperate(true)
 *     around its loop) and asks cli_interrupt_pending() at each safe point:
 *     the first signal only sets that flag, and the command stops, cleans
 *     up through its normal paths, prints one line and returns
 *     cli_interrupt_status(signal), 128 + N, what a shell shows for a
 *     process killed by signal N;
 *   - any signal outside such a loop, and a second one inside it, removes
 *     every tracked temporary and ends the process by the signal itself
 *     (its default action), so that the shell sees it (no core dump).
 * cli_outputs tracks each output's temporary from the moment it exists
 * until it is committed or removed.
 *
 * The state is the program's own (static storage in interrupt.c): a signal
 * handler has nowhere else to find it. It belongs to the thread that calls
 * cli_interrupt_install, the main one, which alone calls these functions; a
 * signal that lands on another thread (a worker of the library's pool) is
 * passed on to it.
 */
#ifndef ATTN_CLI_INTERRUPT_H
#define ATTN_CLI_INTERRUPT_H

#include <stdbool.h>

/* Catches SIGINT, SIGTERM, SIGHUP and SIGPIPE, except one the program was
 * started with ignored (nohup's SIGHUP, SIGINT of a shell's background
 * job), which stays ignored. */
void cli_interrupt_install(void);

/* Holds the four signals back on this thread: they wait, and are acted on
 * at the matching cli_interrupt_release. For a step that must happen whole
 * (a temporary made and tracked, a set of files renamed into place, a
 * library save that writes a temporary of its own). Nests. */
void cli_interrupt_hold(void);
void cli_interrupt_release(void);

/* path, a temporary to remove on the way out when a signal ends the
 * process; the string must stay as it is until cli_interrupt_untrack.
 * False (nothing tracked) when out of memory. Call both with the signals
 * held around making or removing the file, so that no signal falls between
 * the file and the list. */
bool cli_interrupt_track(const char *path);
/* Forgets path (the same pointer); nothing when it is not tracked. */
void cli_interrupt_untrack(const char *path);
/* dir, a directory the command made, removed (if empty) after the tracked
 * temporaries when a signal ends the process; NULL: none. The string must
 * stay as it is while tracked. */
void cli_interrupt_track_dir(const char *dir);

/* Whether the command polls: on, the first signal waits for it as
 * cli_interrupt_pending(). */
void cli_interrupt_cooperate(bool on);
/* The number of the signal received while cooperating, or 0. */
int cli_interrupt_pending(void);

/* Ends the cooperation. A signal that came after the command's last safe
 * point, when it finished its work all the same (rc CLI_OK): a line saying
 * so ("attn: <command>: interrupted (SIGINT) as it finished: <done>") and
 * its status. Otherwise rc. */
int cli_interrupt_finish(const char *command, const char *done, int rc);

/* "SIGINT", "SIGTERM", "SIGHUP", "SIGPIPE" (or "a signal"). */
const char *cli_interrupt_name(int sig);
/* 128 + sig: the exit status of a command stopped by signal sig. */
int cli_interrupt_status(int sig);

#endif /* ATTN_CLI_INTERRUPT_H */
