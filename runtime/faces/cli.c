/*
 * cli.c — the berth command: replay, chat, lua.
 *
 *   berth replay FILE   plays a conversation script with the scripted model against a
 *                       local sandboxd (or --daemon), prints the transcript, exits 1
 *                       when an expectation fails or a hook fails
 *   berth chat          a terminal chat (stdin lines) with the default hooks
 *   berth lua FILE      runs a Lua file with berth's modules (json, sandbox, model, log,
 *                       sleep, now) and the full standard library, e.g. busted
 */
#include "cli.h"
#include "xalloc.h"
#include "runtime.h"
#include "model.h"
#include "store/store.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <readline/history.h>
#include <readline/readline.h>

#define REPLAY_IDLE_TIMEOUT 3.0
#define REPLAY_TIME_LIMIT 600.0
#define CALL_TIMEOUT_MS 30000   /* per executeCode call, as the example agent (H16) */
/* After --time-limit or a signal, how long the sandboxes' disposal may take before
 * the command stops anyway. */
#define DISPOSE_LIMIT 10.0

static const char usage_text[] =
  "usage: berth COMMAND [options]\n"
  "\n"
  "berth hosts chat agents whose hooks are Lua scripts and whose code runs in verified\n"
  "plimsoll sandboxes.\n"
  "\n"
  "commands:\n"
  "  replay FILE      play a conversation script (scripted model) and print the transcript\n"
  "  chat             chat in the terminal, one message per line\n"
  "  lua FILE [ARGS]  run a Lua file with berth's modules loaded (e.g. busted specs)\n"
  "  serve            serve many conversations over HTTP (server-sent events)\n"
  "\n"
  "  berth COMMAND --help   options of a command\n"
  "  berth --version        versions\n";

static const char replay_usage[] =
  "usage: berth replay [options] FILE\n"
  "\n"
  "Plays the conversation script FILE (.lua or .json; see runtime/README.md) with the\n"
  "scripted model through the hooks, one turn after another, suspends where the script\n"
  "says idle, completes at the end, and prints the transcript.  Exits 1 when an\n"
  "expectation fails or a hook fails, 2 on bad usage.\n"
  "\n"
  "  --daemon URL             use this plimsoll daemon (with --daemon-token-file)\n"
  "                           instead of starting a local sandboxd\n"
  "  --daemon-token-file FILE the daemon's bearer token (first line; --token-file is\n"
  "                           the old spelling)\n"
  "  --sandboxd PATH          the sandboxd to start (default: $BERTH_SANDBOXD, the one\n"
  "                           next to berth, else PATH)\n"
  "  --provider NAME          the local sandboxd's provider (default $BERTH_PROVIDER, else\n"
  "                           echo); also selects the script's provider expectations\n"
  "                           (by default the provider a daemon's Describe names)\n"
  "  --hooks FILE             the hooks (default: the shipped code_chat.lua)\n"
  "  --idle-timeout SECONDS   idle time before a conversation suspends, 0 never (default:\n"
  "                           the script's idleTimeout, else 3)\n"
  "  --minimum-isolation TIER the floor: process, container, kernel or vm (default\n"
  "                           container for a daemon over http on this machine, kernel\n"
  "                           for one over https)\n"
  "  --time-limit SECONDS     give up after this long (default 600)\n"
  "  --verbose                show the daemon's log and debug lines\n"
  "  --help, --version\n";

static const char chat_usage[] =
  "usage: berth chat [options]\n"
  "\n"
  "A terminal chat: each line of standard input is a message; /suspend suspends the\n"
  "conversation, /quit (or end of input, Ctrl-D) completes it.  Tool calls and their\n"
  "results are shown as they happen.  On a terminal: line editing and a history file\n"
  "($BERTH_HISTORY, else ~/.berth_history; empty: none), a spinner while the model or a\n"
  "cell runs, Ctrl-C cancels the running turn (at the prompt it exits, status 130).\n"
  "\n"
  "  --model SPEC             the model (required without --hooks): scripted:FILE, or\n"
  "                           openai[:NAME] (an OpenAI-compatible server:\n"
  "                           BERTH_MODEL_URL, BERTH_API_KEY, BERTH_MODEL; see berth(1))\n"
  "  --hooks FILE             the hooks (default: the shipped code_chat.lua)\n"
  "  --approve                ask before each cell runs: yes, no or always (the hooks'\n"
  "                           approve(); default hooks scripts/examples/approval.lua)\n"
  "  --daemon URL, --daemon-token-file FILE\n"
  "                           a running daemon (default: $PLIMSOLL_URL and\n"
  "                           $PLIMSOLL_TOKEN, else a local sandboxd)\n"
  "  --sandboxd PATH          the local sandboxd to start (as for replay)\n"
  "  --provider NAME          its provider (default $BERTH_PROVIDER, else auto: the\n"
  "                           strongest that passes its smoke test here, gvisor then\n"
  "                           bwrap; echo runs no code, and says so on every result)\n"
  "  --idle-timeout SECONDS   idle time before the conversation suspends, 0 never\n"
  "                           (default 30)\n"
  "  --store URL              keep the conversation (sqlite:PATH): its id is printed at\n"
  "                           start, and /quit or end of input suspends it instead of\n"
  "                           completing it, so that it can be continued\n"
  "  --resume ID              continue conversation ID of --store: its last messages are\n"
  "                           shown, and its next cell runs in a fresh sandbox\n"
  "  --minimum-isolation TIER (default container over http, kernel over https)\n"
  "  --verbose                the daemon's log, debug lines, hooks' tracebacks\n"
  "  --help, --version\n";

static const char lua_usage[] =
  "usage: berth lua [options] FILE [ARGS...]\n"
  "\n"
  "Runs FILE as a coroutine with the full standard library and berth's modules (json,\n"
  "sandbox, model, log, sleep, now), so natives that wait work at its top level:\n"
  "  berth lua /usr/bin/busted spec/\n"
  "The shipped scripts directory is on package.path.  Options come before FILE.\n"
  "\n"
  "  --daemon URL, --daemon-token-file FILE\n"
  "                           a daemon for the sandbox natives (default: $PLIMSOLL_URL\n"
  "                           and $PLIMSOLL_TOKEN; none: they answer \"Nothing ran\")\n"
  "  --sandboxd PATH, --provider NAME\n"
  "                           start a local sandboxd instead\n"
  "  --model SPEC             a model for model.chat (scripted:FILE, openai[:NAME])\n"
  "  --minimum-isolation TIER (default container over http, kernel over https)\n"
  "  --verbose, --help, --version\n";

typedef struct opts {
  const char *daemon_url, *token_file, *sandboxd, *provider, *hooks, *model, *min_iso;
  double idle, time_limit;
  bool idle_set;                /* --idle-timeout given (0: never) */
  bool verbose, start_local, approve;
  const char *store, *resume;   /* berth chat --store URL [--resume ID] */
} opts;

enum {
  O_DAEMON = 256, O_TOKEN_FILE, O_SANDBOXD, O_PROVIDER, O_HOOKS, O_MODEL, O_IDLE, O_MIN_ISO,
  O_TIME_LIMIT, O_VERBOSE, O_HELP, O_VERSION, O_APPROVE,
  O_STORE, O_RESUME
};

static const struct option long_opts[] = {
  {"daemon", required_argument, NULL, O_DAEMON},
  {"daemon-token-file", required_argument, NULL, O_TOKEN_FILE},
  {"token-file", required_argument, NULL, O_TOKEN_FILE},   /* the old spelling */
  {"sandboxd", required_argument, NULL, O_SANDBOXD},
  {"provider", required_argument, NULL, O_PROVIDER},
  {"hooks", required_argument, NULL, O_HOOKS},
  {"model", required_argument, NULL, O_MODEL},
  {"idle-timeout", required_argument, NULL, O_IDLE},
  {"minimum-isolation", required_argument, NULL, O_MIN_ISO},
  {"time-limit", required_argument, NULL, O_TIME_LIMIT},
  {"verbose", no_argument, NULL, O_VERBOSE},
  {"approve", no_argument, NULL, O_APPROVE},
  {"store", required_argument, NULL, O_STORE},
  {"resume", required_argument, NULL, O_RESUME},
  {"help", no_argument, NULL, O_HELP},
  {"version", no_argument, NULL, O_VERSION},
  {NULL, 0, NULL, 0}
};

static void print_version(void)
{
  printf("berth %s (libplimsoll %s, protocol %d, %s)\n", BERTH_VERSION, PLIMSOLL_VERSION,
         PLIMSOLL_PROTOCOL, LUA_RELEASE);
}

static bool parse_seconds(const char *s, double *out)
{
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || v < 0 || v != v)
    return false;
  *out = v;
  return true;
}

/* Returns -1 to go on, else the exit status. */
static int parse_opts(int argc, char **argv, const char *usage, const char *allowed, opts *o)
{
  memset(o, 0, sizeof *o);
  o->time_limit = REPLAY_TIME_LIMIT;
  optind = 1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, "+:", long_opts, NULL)) != -1) {
    const char *name = NULL;
    for (const struct option *lo = long_opts; lo->name; lo++)
      if (lo->val == c)
        name = lo->name;
    if (c != '?' && name && !strstr(allowed, name)) {
      fprintf(stderr, "berth %s: --%s is not an option of this command\n\n%s", argv[0], name,
              usage);
      return 2;
    }
    switch (c) {
      case O_DAEMON: o->daemon_url = optarg; break;
      case O_TOKEN_FILE: o->token_file = optarg; break;
      case O_SANDBOXD: o->sandboxd = optarg; o->start_local = true; break;
      case O_PROVIDER: o->provider = optarg; break;
      case O_HOOKS: o->hooks = optarg; break;
      case O_MODEL: o->model = optarg; break;
      case O_MIN_ISO:
        if (!*optarg || !plm_valid_floor(optarg)) {
          fprintf(stderr, "berth %s: --minimum-isolation takes process, container, kernel or "
                          "vm, not \"%s\"\n", argv[0], optarg);
          return 2;
        }
        o->min_iso = optarg;
        break;
      case O_VERBOSE: o->verbose = true; break;
      case O_APPROVE: o->approve = true; break;
      case O_STORE: o->store = optarg; break;
      case O_RESUME: o->resume = optarg; break;
      case O_IDLE:
        if (!parse_seconds(optarg, &o->idle)) {
          fprintf(stderr, "berth %s: --idle-timeout needs seconds >= 0\n", argv[0]);
          return 2;
        }
        o->idle_set = true;
        break;
      case O_TIME_LIMIT:
        if (!parse_seconds(optarg, &o->time_limit) || o->time_limit == 0) {
          fprintf(stderr, "berth %s: --time-limit needs seconds > 0\n", argv[0]);
          return 2;
        }
        break;
      case O_HELP: fputs(usage, stdout); return 0;
      case O_VERSION: print_version(); return 0;
      case ':':
        fprintf(stderr, "berth %s: %s needs a value\n\n%s", argv[0], argv[optind - 1], usage);
        return 2;
      default:
        fprintf(stderr, "berth %s: unknown option %s\n\n%s", argv[0], argv[optind - 1], usage);
        return 2;
    }
  }
  return -1;
}

/* The first line of a token file, without surrounding blanks. */
static char *read_token(const char *path)
{
  FILE *f = fopen(path, "r");
  if (!f) {
    fprintf(stderr, "berth: cannot read the token file %s: %s\n", path, strerror(errno));
    return NULL;
  }
  char *line = NULL;            /* (a line of any length: a token may be long) */
  size_t cap = 0;
  char *tok = NULL;
  while (getline(&line, &cap, f) >= 0) {
    char *s = line;
    while (*s == ' ' || *s == '\t')
      s++;
    size_t n = strcspn(s, "\r\n");
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t'))
      n--;
    s[n] = '\0';
    if (n && s[0] != '#') {
      tok = berth_xstrdup(s);
      break;
    }
  }
  free(line);
  fclose(f);
  if (!tok)
    fprintf(stderr, "berth: the token file %s holds no token\n", path);
  return tok;
}

/* {====================================================== the daemon connection */

typedef struct conn {
  berth_daemon local;
  bool own;
  const char *url;
  char *token;
  const char *provider;        /* known provider, or NULL */
} conn;

/* A daemon: --daemon (+ --token-file), else the environment (if allowed), else a
 * local sandboxd (if allowed) with --provider, else $BERTH_PROVIDER, else `fallback`.
 * Returns 0, 1 for "none", or -1 on error. */
static int connect_daemon(const opts *o, conn *c, bool use_env, bool start_local,
                          const char *fallback)
{
  memset(c, 0, sizeof *c);
  c->local.pid = -1;
  c->local.out_fd = -1;
  if (o->daemon_url) {
    c->url = o->daemon_url;
    if (o->token_file && !(c->token = read_token(o->token_file)))
      return -1;
    c->provider = o->provider;
    return 0;
  }
  if (use_env && getenv("PLIMSOLL_URL") && *getenv("PLIMSOLL_URL") && !o->start_local &&
      !o->provider) {           /* (--provider asks for a local sandboxd: it wins) */
    c->url = getenv("PLIMSOLL_URL");
    if (getenv("PLIMSOLL_TOKEN"))
      c->token = berth_xstrdup(getenv("PLIMSOLL_TOKEN"));
    c->provider = o->provider;
    return 0;
  }
  if (!start_local && !o->start_local && !o->provider)
    return 1;
  const char *provider = o->provider;
  if (!provider)
    provider = getenv("BERTH_PROVIDER") && *getenv("BERTH_PROVIDER") ? getenv("BERTH_PROVIDER")
                                                                     : fallback;
  if (berth_daemon_start(&c->local, o->sandboxd, provider, o->verbose) != 0)
    return -1;
  berth_daemon_watch(&c->local, ev_default_loop(0));  /* started again if it dies */
  c->own = true;
  c->url = c->local.url;
  c->token = berth_xstrdup(c->local.token);
  c->provider = provider;
  return 0;
}

static void disconnect_daemon(conn *c)
{
  if (c->own)
    berth_daemon_stop(&c->local);
  free(c->token);
  c->token = NULL;
}

static void cli_log(void *ud, berth_log_level level, const char *message)
{
  const opts *o = ud;
  if (level == BERTH_LOG_DEBUG && !o->verbose)
    return;
  static const char *const names[] = {"debug: ", "", "warning: ", "error: "};
  fprintf(stderr, "berth: %s%s\n", names[level], message);
}

/* A signal watcher that keeps nothing alive by itself (the loop ends when the work
 * does), and its stop.  `data` goes to w->data. */
static void watch_signal(struct ev_loop *loop, ev_signal *w,
                         void (*cb)(struct ev_loop *, ev_signal *, int), int signum, void *data)
{
  ev_signal_init(w, cb, signum);
  w->data = data;
  ev_signal_start(loop, w);
  ev_unref(loop);
}

static void unwatch_signal(struct ev_loop *loop, ev_signal *w)
{
  ev_ref(loop);                 /* (a stopped watcher gives its reference back) */
  ev_signal_stop(loop, w);
}

static void stop_loop(struct ev_loop *loop, ev_timer *w, int revents)
{
  (void)w;
  (void)revents;
  ev_break(loop, EVBREAK_ALL);
}

/* Ends a run before its end (--time-limit, a signal): the host shuts down -- the
 * sandboxes disposed -- and `done` breaks the loop; `bound` (a stop_loop timer of
 * DISPOSE_LIMIT) stops it however far the disposal got. */
static void shut_down_within(berth_host *h, struct ev_loop *loop, ev_timer *bound,
                             void (*done)(void *ud), void *ud)
{
  ev_timer_start(loop, bound);
  berth_host_shutdown(h, done, ud);
}

/* }====================================================== */

/* {====================================================== replay */

typedef struct replay {
  struct ev_loop *loop;
  opts *o;
  berth_host *h;
  berth_model *model;
  berth_conv *conv;
  const json_t *turns;
  size_t next;
  unsigned turns_played;
  bool want_suspend;
  berth_transcript tr;
  ev_timer limit, bound;         /* --time-limit; the disposal's bound (shut_down_within) */
  ev_signal sigint, sigterm;
  bool completed;               /* the script's end was reached and the host shut down */
  bool timed_out, stopped;      /* --time-limit; a step that cannot be played */
  int signal;                   /* the signal that stopped it, or 0 */
} replay;

static void replay_step(replay *r);

static void replay_shut(void *ud)
{
  replay *r = ud;
  ev_break(r->loop, EVBREAK_ALL);
}

static void replay_completed(void *ud, berth_conv *c)
{
  (void)c;
  replay *r = ud;
  r->completed = true;
  berth_host_shutdown(r->h, replay_shut, r);
}

/* Whether the run was ended before the script's end (and is shutting down). */
static bool replay_abandoned(const replay *r)
{
  return r->stopped || r->timed_out || r->signal;
}

/* Ends the run before the script's end: running turns are cancelled at once (the
 * host's grace is none), the sandboxes disposed within DISPOSE_LIMIT. */
static void replay_abandon(replay *r)
{
  ev_timer_stop(r->loop, &r->limit);
  shut_down_within(r->h, r->loop, &r->bound, replay_shut, r);
}

static void replay_event(void *ud, berth_conv *c, const char *kind, const json_t *data)
{
  (void)c;
  replay *r = ud;
  berth_transcript_event(&r->tr, kind, data);
  if (replay_abandoned(r))
    return;
  if (strcmp(kind, "turnEnd") == 0)
    replay_step(r);
  else if (strcmp(kind, "suspend") == 0 && r->want_suspend) {
    r->want_suspend = false;
    replay_step(r);
  }
}

static void replay_check(void *ud, bool ok, const char *what)
{
  replay *r = ud;
  berth_transcript_check(&r->tr, ok, what);
}

/* A step the script cannot go on from: said, and the run ends (status 1). */
static void replay_cannot(replay *r, const char *why)
{
  fprintf(stderr, "berth replay: step %zu of %zu: %s\n", r->next,
          json_array_size(r->turns), why);
  r->stopped = true;
  replay_abandon(r);
}

static void replay_step(replay *r)
{
  if (r->next >= json_array_size(r->turns)) {
    fputs("== complete ==\n", r->tr.out);
    berth_conv_complete(r->conv, replay_completed, r);
    return;
  }
  const json_t *turn = json_array_get(r->turns, r->next++);
  const json_t *idle = json_object_get(turn, "idle");
  if (idle) {
    bool wait = !json_is_true(idle);
    fprintf(r->tr.out, "== idle%s ==\n", wait ? " (waiting for the idle timeout)" : "");
    if (berth_conv_suspended(r->conv)) {   /* nothing to suspend, no timer to wait for */
      fputs("-- idle: the conversation is suspended already --\n", r->tr.out);
      replay_step(r);
      return;
    }
    if (wait && r->o->idle <= 0) {
      replay_cannot(r, "it waits for the idle timeout, and there is none (idle timeout 0)");
      return;
    }
    if (wait && !r->turns_played) {
      replay_cannot(r, "it waits for the idle timeout before any turn, and the idle timer "
                       "starts when a turn ends");
      return;
    }
    r->want_suspend = true;
    if (!wait)
      berth_conv_suspend(r->conv);
    return;
  }
  fprintf(r->tr.out, "\n== turn %u ==\n", ++r->turns_played);
  berth_conv_send(r->conv, json_string_value(json_object_get(turn, "user")));
}

static void replay_limit(struct ev_loop *loop, ev_timer *w, int revents)
{
  (void)revents;
  (void)loop;
  replay *r = w->data;
  fprintf(stderr, "berth replay: gave up after %.0f s (--time-limit)\n", r->o->time_limit);
  r->timed_out = true;
  replay_abandon(r);
}

static void replay_signal(struct ev_loop *loop, ev_signal *w, int revents)
{
  (void)revents;
  replay *r = w->data;
  if (replay_abandoned(r)) {    /* a second one: stop now */
    ev_break(loop, EVBREAK_ALL);
    return;
  }
  r->signal = w->signum;
  fprintf(stderr, "berth replay: %s: disposing of the sandboxes and stopping\n",
          strsignal(w->signum));
  replay_abandon(r);
}

static int cmd_replay(int argc, char **argv)
{
  opts o;
  int rc = parse_opts(argc, argv, replay_usage,
                      "daemon daemon-token-file token-file sandboxd provider hooks idle-timeout "
                      "minimum-isolation time-limit verbose help version", &o);
  if (rc >= 0)
    return rc;
  if (optind != argc - 1) {
    fprintf(stderr, "berth replay: give one script FILE\n\n%s", replay_usage);
    return 2;
  }
  const char *file = argv[optind];
  char *err = NULL;
  json_t *script = berth_script_load(file, &err);
  if (!script) {
    fprintf(stderr, "berth replay: %s\n", err);
    free(err);
    return 2;
  }
  char *scripts = berth_find_scripts_dir();
  char hooks[4096];
  if (o.hooks)
    snprintf(hooks, sizeof hooks, "%s", o.hooks);
  else if (scripts)
    snprintf(hooks, sizeof hooks, "%s/code_chat.lua", scripts);
  else {
    fprintf(stderr, "berth replay: cannot find the shipped scripts (set BERTH_SCRIPTS, or "
                    "give --hooks)\n");
    json_decref(script);
    return 2;
  }
  if (!o.idle_set) {
    const json_t *it = json_object_get(script, "idleTimeout");
    if (it && !(json_is_number(it) && json_number_value(it) >= 0)) {
      fprintf(stderr, "berth replay: %s: idleTimeout must be seconds >= 0 (0: never)\n", file);
      json_decref(script);
      free(scripts);
      return 2;
    }
    o.idle = it ? json_number_value(it) : REPLAY_IDLE_TIMEOUT;
  }

  struct ev_loop *loop = ev_default_loop(0);
  replay r;
  memset(&r, 0, sizeof r);
  r.loop = loop;
  r.o = &o;
  r.tr.out = stdout;
  r.turns = json_object_get(script, "turns");
  conn c;
  int status = 1;
  if (connect_daemon(&o, &c, false, true, "echo") != 0) {
    json_decref(script);
    free(scripts);
    return 1;
  }
  berth_model_options mo = {loop, c.provider, replay_check, &r};
  r.model = berth_scripted_new(script, &mo, &err);
  berth_options ho;
  berth_options_init(&ho);
  ho.loop = loop;
  ho.hooks_file = hooks;
  ho.lib_dir = scripts;
  ho.idle_timeout = o.idle;     /* (0: never) */
  ho.shutdown_grace = -1;       /* a shutdown before the end cancels at once */
  ho.daemon_url = c.url;
  ho.daemon_token = c.token;
  ho.minimum_isolation = o.min_iso ? o.min_iso : berth_default_floor(ho.daemon_url);
  ho.timeout_ms = CALL_TIMEOUT_MS;
  ho.model = r.model;
  ho.on_event = replay_event;
  ho.event_ud = &r;
  ho.log = cli_log;
  ho.log_ud = &o;
  if (berth_host_new(&ho, &r.h, &err) != 0) {
    fprintf(stderr, "berth replay: %s\n", err);
    free(err);
    goto out;
  }
  if (!c.provider) {
    berth_daemon_facts df;
    if (berth_daemon_describe(loop, c.url, c.token, &df) != 0)
      goto out;
    berth_scripted_set_provider(r.model, df.sandbox);
    berth_daemon_facts_clear(&df);
  }
  {
    const json_t *title = json_object_get(script, "title");
    printf("berth replay %s%s%s\n", file, json_is_string(title) ? ": " : "",
           json_is_string(title) ? json_string_value(title) : "");
    printf("daemon %s%s, idle timeout %.3g s\n", c.own ? "started at " : "", c.url, o.idle);
  }
  const json_t *run = json_object_get(script, "runId");
  const json_t *user = json_object_get(script, "userId");
  r.conv = berth_conv_new(r.h, json_is_string(run) ? json_string_value(run) : "run-1",
                          json_is_string(user) ? json_string_value(user) : NULL);
  ev_timer_init(&r.limit, replay_limit, o.time_limit, 0.);
  r.limit.data = &r;
  ev_timer_init(&r.bound, stop_loop, DISPOSE_LIMIT, 0.);   /* (armed by shut_down_within) */
  ev_timer_start(loop, &r.limit);
  ev_unref(loop);               /* the limit alone keeps nothing alive */
  watch_signal(loop, &r.sigint, replay_signal, SIGINT, &r);
  watch_signal(loop, &r.sigterm, replay_signal, SIGTERM, &r);
  replay_step(&r);
  ev_run(loop, 0);
  ev_ref(loop);
  ev_timer_stop(loop, &r.limit);
  ev_timer_stop(loop, &r.bound);
  unwatch_signal(loop, &r.sigint);
  unwatch_signal(loop, &r.sigterm);
  if (!r.completed && !replay_abandoned(&r)) {
    /* The loop ran out of work before the script's end: say so, never exit 0. */
    fprintf(stderr, "berth replay: stopped at step %zu of %zu with nothing left to wait "
                    "for\n", r.next, json_array_size(r.turns));
    r.stopped = true;
  }

  unsigned checked, failed;
  berth_scripted_finish(r.model, &checked, &failed);
  unsigned errors = berth_host_errors(r.h);
  printf("\nreplay: %u turn%s, %u check%s, %u failed, %u hook error%s%s\n", r.turns_played,
         r.turns_played == 1 ? "" : "s", checked, checked == 1 ? "" : "s", failed, errors,
         errors == 1 ? "" : "s", r.timed_out ? ", timed out"
                                 : r.signal ? ", stopped by a signal"
                                 : r.stopped ? ", stopped before the script's end" : "");
  status = r.signal ? 128 + r.signal : failed || errors || r.timed_out || r.stopped ? 1 : 0;
out:
  if (r.conv)
    berth_conv_free(r.conv);
  berth_host_free(r.h);
  berth_model_free(r.model);
  disconnect_daemon(&c);
  json_decref(script);
  free(scripts);
  ev_loop_destroy(loop);
  return status;
}

/* }====================================================== */

/* {====================================================== chat */

/*
 * The terminal chat.  On a terminal, standard input goes through GNU readline (line
 * editing, a history file) in its callback mode, so the loop keeps running while the
 * person types; on a pipe, lines are read as they come.  Either way one message is
 * taken at a time: the next line is read once the turn before it ended (or to answer
 * an approval question), so what the person types during a turn waits for the prompt.
 * On a terminal a spinner shows what the turn waits for and for how long.  Ctrl-C
 * cancels the running turn; at the prompt it exits (status 130).
 */

#define SPIN_INTERVAL 0.1
#define CHAT_LINE_MAX (1024 * 1024)   /* a message from a pipe, as serve's default body */
#define HISTORY_LINES 1000

typedef struct ask_op ask_op;

typedef struct chat {
  struct ev_loop *loop;
  const opts *o;
  berth_host *h;
  berth_conv *conv;
  berth_transcript tr;
  ev_io in;
  ev_signal sigint, sighup, sigterm;
  ev_timer spin;
  char *buf;                    /* a pipe's input not taken yet (grows to a line) */
  size_t len, cap;
  bool skipping;                /* in a line over CHAT_LINE_MAX: dropped to its end */
  bool tty;                     /* standard input is a terminal: readline */
  bool spinner;                 /* standard output is a terminal */
  bool rl_on;                   /* readline's line handler is installed */
  bool eof;                     /* a pipe ended */
  bool ending, interrupted;
  int terminated;               /* SIGTERM: exit 128 + it, once the conversation ended */
  bool pumping;                 /* chat_pump_pipe's loop runs (it listens after) */
  unsigned sent, ended;         /* messages sent, turns ended */
  ask_op *asking;               /* an approval waiting for the person's answer */
  const char *what;             /* what the turn waits for (the spinner's label) */
  double since;                 /* ... since when (ev_now) */
  bool spin_shown;
  unsigned frame;
  char *history;                /* the history file, or NULL */
} chat;

/* readline's callbacks take no user data: the one chat of this process. */
static chat *the_chat;

static bool chat_turn_running(const chat *c)
{
  return c->sent != c->ended;
}

/* {-------- the spinner */

static void spin_clear(chat *c)
{
  if (c->spin_shown) {
    fputs("\r\033[K", stdout);
    fflush(stdout);
    c->spin_shown = false;
  }
}

static void spin_draw(chat *c)
{
  static const char *const frames[] = {"⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"};
  if (!c->spinner || !chat_turn_running(c) || c->asking || c->tr.in_delta || c->ending)
    return;
  printf("\r\033[K%s %s %.1f s", frames[c->frame++ % 10], c->what,
         ev_now(c->loop) - c->since);
  fflush(stdout);
  c->spin_shown = true;
}

static void on_spin(struct ev_loop *loop, ev_timer *w, int revents)
{
  (void)loop;
  (void)revents;
  spin_draw(w->data);
}

static void spin_phase(chat *c, const char *what)
{
  c->what = what;
  c->since = ev_now(c->loop);
}

/* }-------- */

/* {-------- the input */

static void chat_take_line(chat *c, char *line);

static void on_rl_line(char *line)
{
  chat *c = the_chat;
  c->rl_on = false;
  rl_callback_handler_remove();  /* installed again when the next line is wanted */
  if (!line)
    putchar('\n');               /* Ctrl-D leaves the cursor after the prompt */
  chat_take_line(c, line);
  free(line);
}

/* Output from the loop while the prompt may be on screen: the prompt and what was
 * typed are cleared first and drawn again after (chat_output_end). */
static void chat_output_begin(chat *c)
{
  spin_clear(c);
  if (c->rl_on) {
    fputs("\r\033[K", stdout);
    fflush(stdout);
  }
}

static void chat_output_end(chat *c)
{
  fflush(stdout);
  if (c->rl_on)
    rl_forced_update_display();
}

static const char *chat_prompt_text(const chat *c)
{
  return c->asking ? "run this cell? [y]es / [n]o / [a]lways: " : "you> ";
}

static void chat_pump_pipe(chat *c);

/* Reads input when a line is wanted: at the prompt, or for an approval. */
static void chat_listen(chat *c)
{
  bool want = !c->ending && (c->asking || !chat_turn_running(c));
  if (c->tty) {
    if (want && !c->rl_on) {
      spin_clear(c);
      rl_callback_handler_install(chat_prompt_text(c), on_rl_line);
      c->rl_on = true;
    } else if (!want && c->rl_on) {
      rl_callback_handler_remove();
      c->rl_on = false;
    }
  } else if (c->pumping) {
    return;                     /* the pump's loop goes on and listens after it */
  } else if (want) {
    chat_pump_pipe(c);
    return;
  }
  if (want && !c->eof)
    ev_io_start(c->loop, &c->in);
  else
    ev_io_stop(c->loop, &c->in);
  if (chat_turn_running(c) && !c->asking && c->spinner)
    ev_timer_again(c->loop, &c->spin);
  else
    ev_timer_stop(c->loop, &c->spin);
}

/* Drops the first n bytes of the pipe's buffer. */
static void chat_consume(chat *c, size_t n)
{
  memmove(c->buf, c->buf + n, c->len - n);
  c->len -= n;
}

/* A pipe: the complete lines buffered, one at a time while lines are wanted, then
 * the end of input once everything before it was taken. */
static void chat_pump_pipe(chat *c)
{
  c->pumping = true;
  for (;;) {
    bool want = !c->ending && (c->asking || !chat_turn_running(c));
    if (!want)
      break;
    char *nl = c->len ? memchr(c->buf, '\n', c->len) : NULL;
    if (c->skipping) {          /* the rest of a line too long to send */
      chat_consume(c, nl ? (size_t)(nl - c->buf) + 1 : c->len);
      c->skipping = !nl;
      if (c->skipping && !c->eof)
        break;
      c->skipping = false;
      continue;
    }
    if (!nl && c->len >= CHAT_LINE_MAX) {
      fprintf(stderr, "berth chat: a line of more than %d bytes was not sent\n",
              CHAT_LINE_MAX);
      c->skipping = true;
      continue;
    }
    if (!nl && c->eof && c->len)
      nl = c->buf + c->len;    /* the last line, without its newline */
    if (!nl) {
      if (c->eof)
        chat_take_line(c, NULL);
      break;
    }
    size_t n = (size_t)(nl - c->buf);
    size_t used = n < c->len ? n + 1 : n;   /* (with its newline, when it has one) */
    if (memchr(c->buf, '\0', n)) {   /* a C string would end there: refused whole */
      chat_output_begin(c);
      puts("-- not sent: the line holds a NUL byte --");
      chat_output_end(c);
      chat_consume(c, used);
      continue;
    }
    char *line = berth_xmalloc(n + 1);
    memcpy(line, c->buf, n);
    line[n] = '\0';
    if (n && line[n - 1] == '\r')
      line[n - 1] = '\0';
    chat_consume(c, used);
    chat_take_line(c, line);
    free(line);
  }
  c->pumping = false;
  bool want = !c->ending && (c->asking || !chat_turn_running(c));
  if (want && !c->eof)
    ev_io_start(c->loop, &c->in);
  else
    ev_io_stop(c->loop, &c->in);
  if (chat_turn_running(c) && !c->asking && c->spinner)
    ev_timer_again(c->loop, &c->spin);
  else
    ev_timer_stop(c->loop, &c->spin);
}

static void chat_input(struct ev_loop *loop, ev_io *w, int revents)
{
  (void)loop;
  (void)revents;
  chat *c = w->data;
  if (c->tty) {
    rl_callback_read_char();
    return;
  }
  if (c->cap - c->len < 65536) {   /* room for a read; a line may grow to the limit */
    c->cap = c->cap ? c->cap * 2 : 65536;
    c->buf = berth_xrealloc(c->buf, c->cap);
  }
  ssize_t n = read(STDIN_FILENO, c->buf + c->len, c->cap - c->len);
  if (n < 0 && (errno == EINTR || errno == EAGAIN))
    return;
  if (n <= 0)
    c->eof = true;
  else
    c->len += (size_t)n;
  chat_pump_pipe(c);
}

/* }-------- */

/* {-------- approval (berth chat --approve) */

/* The person's answer to "run this cell?", asked from a hook: approve(ctx, code,
 * language) in the hooks table (scripts/examples/approval.lua calls it before each
 * cell) waits for a line of input. */
struct ask_op {
  berth_op op;
  chat *c;
  const char *answer, *why;
};

static void ask_cancel(berth_op *op)
{
  ask_op *a = (ask_op *)op;
  if (a->c->asking == a) {
    a->c->asking = NULL;
    chat_listen(a->c);
  }
  berth_op_finish(op);
}

static const berth_op_class ask_class = {"chat.approve", ask_cancel, NULL};

static int ask_k(lua_State *L, int status, lua_KContext ctx)
{
  (void)status;
  ask_op *a = lua_touserdata(L, (int)ctx);
  berth_op_resumed(L, &a->op);
  lua_pushstring(L, a->answer ? a->answer : "no");
  if (a->why)
    lua_pushstring(L, a->why);
  else
    lua_pushnil(L);
  return 2;
}

static int l_approve(lua_State *L)
{
  chat *c = lua_touserdata(L, lua_upvalueindex(1));
  const char *language = luaL_optstring(L, 3, "python");
  ask_op *a = berth_op_push(L, sizeof *a, &ask_class);
  int idx = lua_gettop(L);
  a->c = c;
  c->asking = a;
  chat_output_begin(c);
  if (!c->tty)                  /* on a terminal the prompt asks */
    printf("approve> run this %s cell? answer y(es), n(o) or a(lways)\n",
           strcmp(language, "nil") ? language : "(default language)");
  chat_output_end(c);
  chat_listen(c);
  return berth_op_wait(L, &a->op, idx, ask_k);
}

static void chat_answer(chat *c, const char *line)
{
  ask_op *a = c->asking;
  size_t n = line ? strspn(line, " \t") : 0;
  const char *s = line ? line + n : "";
  if (!strcasecmp(s, "y") || !strcasecmp(s, "yes"))
    a->answer = "yes";
  else if (!strcasecmp(s, "a") || !strcasecmp(s, "always"))
    a->answer = "always";
  else if (!line || !strcasecmp(s, "n") || !strcasecmp(s, "no")) {
    a->answer = "no";
    a->why = "the person at the terminal said no";
  } else if (c->tty) {
    puts("please answer y, n or a");
    chat_listen(c);             /* asks again */
    return;
  } else {
    a->answer = "no";
    a->why = "the answer was not y, n or a";
  }
  c->asking = NULL;
  spin_phase(c, "running the cell");
  berth_op_finish(&a->op);
  chat_listen(c);
}

/* Makes the hooks' approve(ctx, code, language) ask the person.  Hooks without one
 * would never ask: refused, so that --approve cannot silently approve nothing. */
static int install_approve(chat *c, char **err)
{
  lua_State *L = berth_host_lua(c->h);
  lua_rawgeti(L, LUA_REGISTRYINDEX, c->h->hooks_ref);
  lua_getfield(L, -1, "approve");
  bool has = lua_isfunction(L, -1);
  lua_pop(L, 1);
  if (!has) {
    lua_pop(L, 1);
    *err = berth_xstrdup("--approve needs hooks that ask approve(ctx, code, language) before each "
                  "cell, as scripts/examples/approval.lua and hooks built on it do");
    return -1;
  }
  lua_pushlightuserdata(L, c);
  lua_pushcclosure(L, l_approve, 1);
  lua_setfield(L, -2, "approve");
  lua_pop(L, 1);
  return 0;
}

/* }-------- */

static void chat_shut(void *ud)
{
  chat *c = ud;
  ev_break(c->loop, EVBREAK_ALL);
}

static void chat_completed(void *ud, berth_conv *conv)
{
  (void)conv;
  chat *c = ud;
  berth_host_shutdown(c->h, chat_shut, c);
}

static void chat_end(chat *c)
{
  if (c->ending)
    return;
  c->ending = true;
  chat_listen(c);
  if (c->o->store) {            /* kept to be continued: suspended, not completed */
    if (berth_conv_suspended(c->conv) && !berth_conv_busy(c->conv))
      berth_host_shutdown(c->h, chat_shut, c);
    else
      berth_conv_suspend(c->conv);   /* chat_event shuts down at its "suspend" */
    return;
  }
  berth_conv_complete(c->conv, chat_completed, c);
}

static void chat_event(void *ud, berth_conv *conv, const char *kind, const json_t *data)
{
  (void)conv;
  chat *c = ud;
  chat_output_begin(c);
  const char *code = json_string_value(json_object_get(data, "code"));
  if (!strcmp(kind, "error") && code && !strcmp(code, "cancelled"))
    printf("-- %s --\n", json_string_value(json_object_get(data, "message")));
  else
    berth_transcript_event(&c->tr, kind, data);
  if (!strcmp(kind, "toolCall"))
    spin_phase(c, "running the cell");
  else if (!strcmp(kind, "user") || !strcmp(kind, "toolResult") || !strcmp(kind, "assistant"))
    spin_phase(c, "waiting for the model");
  else if (!strcmp(kind, "turnEnd"))
    c->ended++;
  chat_output_end(c);
  if (!strcmp(kind, "turnEnd"))
    chat_listen(c);
  if (!strcmp(kind, "suspend") && c->ending && c->o->store) {
    printf("-- conversation %s kept: continue it with --store %s --resume %s --\n",
           berth_conv_store_id(c->conv), c->o->store, berth_conv_store_id(c->conv));
    fflush(stdout);
    berth_host_shutdown(c->h, chat_shut, c);
  }
}

/* {-------- a stored conversation (berth chat --store URL [--resume ID]) */

/* One stored message, briefly: its role and the start of its text. */
static void show_stored_message(const char *text)
{
  json_t *m = json_loads(text, 0, NULL);
  const char *role = json_string_value(json_object_get(m, "role"));
  const char *content = json_string_value(json_object_get(m, "content"));
  if (role && content && (!strcmp(role, "user") || !strcmp(role, "assistant"))) {
    size_t n = strcspn(content, "\n");
    printf("  %s> %.*s%s\n", !strcmp(role, "user") ? "you" : "assistant",
           (int)(n > 200 ? 200 : n), content, n > 200 || content[n] ? " …" : "");
  }
  json_decref(m);
}

#define RESUME_SHOWN 6           /* stored messages shown when resuming */

/* Opens the chat's conversation in the store: --resume ID continues that one (its
 * last messages shown; the host gives it a fresh sandbox, which the hooks tell the
 * model at its first cell), else a new one whose id is printed to resume it by. */
static int chat_open_stored(chat *c, berth_store *store)
{
  berth_conv_options co = {0};
  if (c->o->resume) {
    berth_store_conv rec;
    bool found = false;
    berth_error *e = berth_store_get_conv(store, c->o->resume, &rec, &found);
    if (!e && !found)
      e = berth_error_new("invalid_argument", "no conversation %s in the store %s",
                          c->o->resume, c->o->store);
    if (!e && rec.status == BERTH_STORE_COMPLETED)
      e = berth_error_new("completed", "the conversation %s was completed: it takes no "
                                       "more messages", c->o->resume);
    unsigned turns = found ? rec.turns : 0;
    berth_store_conv_clear(&rec);
    char **texts = NULL;
    size_t n = 0;
    if (!e)
      e = berth_store_load_messages(store, c->o->resume, &texts, &n);
    if (!e) {
      co.store_id = c->o->resume;
      e = berth_conv_open(c->h, &co, &c->conv);
    }
    if (e) {
      fprintf(stderr, "berth chat: %s\n", e->message);
      berth_error_free(e);
      berth_store_texts_free(texts, n);
      return -1;
    }
    printf("-- conversation %s resumed: %u turn%s, %zu messages; the last ones: --\n",
           c->o->resume, turns, turns == 1 ? "" : "s", n);
    for (size_t i = n > RESUME_SHOWN ? n - RESUME_SHOWN : 0; i < n; i++)
      show_stored_message(texts[i]);
    printf("-- its sandbox is new: what earlier cells left there is gone (the model is "
           "told at its next cell) --\n");
    berth_store_texts_free(texts, n);
  } else {
    berth_error *e = berth_conv_open(c->h, &co, &c->conv);
    if (e) {
      fprintf(stderr, "berth chat: %s\n", e->message);
      berth_error_free(e);
      return -1;
    }
    printf("-- conversation %s (kept in %s: continue it with --resume %s) --\n",
           berth_conv_store_id(c->conv), c->o->store, berth_conv_store_id(c->conv));
  }
  fflush(stdout);
  return 0;
}

/* }-------- */

static void chat_help(void)
{
  puts("/suspend  suspend now (as if idle)\n"
       "/quit     complete the conversation and exit (also Ctrl-D)\n"
       "Ctrl-C    cancel the running turn; at the prompt, exit");
}

static void chat_take_line(chat *c, char *line)
{
  if (c->asking) {
    chat_answer(c, line);
    return;
  }
  if (!line) {
    chat_end(c);
    return;
  }
  if (c->tty && *line)
    add_history(line);
  if (!strcmp(line, "/quit") || !strcmp(line, "/exit"))
    chat_end(c);
  else if (!strcmp(line, "/suspend"))
    berth_conv_suspend(c->conv);
  else if (!strcmp(line, "/help"))
    chat_help();
  else if (*line) {
    berth_error *e = berth_conv_message(c->conv, line);
    if (!e) {
      c->sent++;
      spin_phase(c, "waiting for the model");
    } else {
      chat_output_begin(c);
      printf("-- not sent: %s --\n", e->message);
      chat_output_end(c);
      berth_error_free(e);
    }
  }
  chat_listen(c);
}

static void chat_sigint(struct ev_loop *loop, ev_signal *w, int revents)
{
  (void)loop;
  (void)revents;
  chat *c = w->data;
  c->interrupted = true;
  if (c->ending) {
    ev_break(c->loop, EVBREAK_ALL);   /* a second ^C while completing: stop now */
    return;
  }
  if (chat_turn_running(c)) {
    chat_output_begin(c);
    puts("^C");
    chat_output_end(c);
    if (berth_conv_cancel_turn(c->conv, "the turn was cancelled (Ctrl-C); the "
                                        "conversation goes on"))
      return;                   /* its turnEnd brings the prompt back */
  }
  if (c->tty && c->rl_on && rl_end > 0) {   /* a line being typed: dropped, as shells do */
    rl_free_line_state();
    rl_callback_sigcleanup();
    rl_replace_line("", 0);
    fputs("^C\n", stdout);
    rl_forced_update_display();
    return;
  }
  if (c->rl_on)
    putchar('\n');
  chat_end(c);
}

/* SIGTERM: as end of input, the running turn cancelled first (the terminal is given
 * back as it was, the conversation kept or completed); a second one stops at once. */
static void chat_sigterm(struct ev_loop *loop, ev_signal *w, int revents)
{
  (void)loop;
  (void)revents;
  chat *c = w->data;
  if (c->terminated || c->ending) {
    c->terminated = w->signum;
    ev_break(c->loop, EVBREAK_ALL);
    return;
  }
  c->terminated = w->signum;
  if (chat_turn_running(c))
    berth_conv_cancel_turn(c->conv, "berth chat was asked to stop (SIGTERM)");
  if (c->asking)
    chat_answer(c, NULL);
  chat_end(c);
}

static void chat_sighup(struct ev_loop *loop, ev_signal *w, int revents)
{
  (void)loop;
  (void)revents;
  chat *c = w->data;
  char *err = NULL;
  if (berth_host_reload(c->h) == 0 && c->o->approve && install_approve(c, &err) != 0) {
    fprintf(stderr, "berth chat: the reloaded hooks: %s; exiting\n", err);
    free(err);
    ev_break(c->loop, EVBREAK_ALL);
  }
}

/* A hook that failed in the chat's conversation is shown once, as its "error> " line;
 * the log's copy, with the traceback, only with --verbose. */
static void chat_log(void *ud, berth_log_level level, const char *message)
{
  chat *c = ud;
  if (level == BERTH_LOG_DEBUG && !c->o->verbose)
    return;
  if (level == BERTH_LOG_ERROR && !c->o->verbose && c->conv) {
    char mark[128];
    snprintf(mark, sizeof mark, " of conversation %s failed: ", berth_conv_run_id(c->conv));
    if (strstr(message, mark))
      return;
  }
  chat_output_begin(c);
  cli_log((void *)c->o, level, message);
  chat_output_end(c);
}

static char *history_path(void)
{
  const char *env = getenv("BERTH_HISTORY");
  if (env)
    return *env ? berth_xstrdup(env) : NULL;  /* set and empty: no history file */
  const char *home = getenv("HOME");
  if (!home || !*home)
    return NULL;
  size_t n = strlen(home) + 32;
  char *p = berth_xmalloc(n);
  snprintf(p, n, "%s/.berth_history", home);
  return p;
}

static void chat_banner(const chat *c, const char *model, const conn *cn,
                        const berth_daemon_facts *df)
{
  if (c->tty)
    printf("berth chat — model %s, code runs in %s (%s isolation)%s; /help for commands\n",
           model, df->sandbox ? df->sandbox : "?", df->isolation ? df->isolation : "?",
           cn->own ? " on a local sandboxd" : "");
  if (c->tr.no_code_runs)
    fprintf(stderr, "berth chat: the echo provider runs NO code: each result is the code "
                    "echoed back, not its output (leave out --provider, or pass --provider "
                    "auto, to run it)\n");
  fflush(stdout);
}

static int cmd_chat(int argc, char **argv)
{
  opts o;
  int rc = parse_opts(argc, argv, chat_usage,
                      "model hooks daemon daemon-token-file token-file sandboxd provider idle-timeout "
                      "minimum-isolation approve store resume verbose help version", &o);
  if (rc >= 0)
    return rc;
  if (optind != argc) {
    fprintf(stderr, "berth chat: unexpected argument %s\n\n%s", argv[optind], chat_usage);
    return 2;
  }
  if (o.store && !strcmp(o.store, "memory")) {
    fprintf(stderr, "berth chat: --store memory keeps nothing once the chat ends: give "
                    "sqlite:PATH to continue the conversation later\n");
    return 2;
  }
  if (o.resume && !o.store) {
    fprintf(stderr, "berth chat: --resume needs --store (where the conversation is kept)\n");
    return 2;
  }
  if (!o.model && !o.hooks) {
    fprintf(stderr, "berth chat: no model: pass --model openai[:NAME] (an OpenAI-compatible "
                    "server: set BERTH_MODEL_URL, BERTH_API_KEY and BERTH_MODEL) or --model "
                    "scripted:FILE (a conversation script)\n");
    return 2;
  }
  struct ev_loop *loop = ev_default_loop(0);
  char *scripts = berth_find_scripts_dir();
  char hooks[4096];
  if (o.hooks)
    snprintf(hooks, sizeof hooks, "%s", o.hooks);
  else if (scripts)
    snprintf(hooks, sizeof hooks, "%s/%s", scripts,
             o.approve ? "examples/approval.lua" : "code_chat.lua");
  else {
    fprintf(stderr, "berth chat: cannot find the shipped scripts (set BERTH_SCRIPTS, or "
                    "give --hooks)\n");
    return 2;
  }
  chat c;
  memset(&c, 0, sizeof c);
  c.loop = loop;
  c.o = &o;
  c.tr.out = stdout;
  c.tr.streaming = true;
  c.tty = isatty(STDIN_FILENO);
  c.spinner = isatty(STDOUT_FILENO);
  the_chat = &c;
  int status = 1;
  char *err = NULL;
  berth_model *model = NULL;
  berth_store *store = NULL;
  berth_daemon_facts df = {NULL, NULL};
  conn cn;
  if (connect_daemon(&o, &cn, true, true, "auto") != 0) {
    free(scripts);
    return 1;
  }
  if (berth_daemon_describe(loop, cn.url, cn.token, &df) != 0)
    goto out;
  c.tr.no_code_runs = df.sandbox && !strcmp(df.sandbox, "echo");
  if (o.model) {
    berth_model_options mo = {loop, df.sandbox, NULL, NULL};
    model = berth_model_new(o.model, &mo, &err);
    if (!model) {               /* (the spec, its script or its settings: usage) */
      fprintf(stderr, "berth chat: %s\n", err);
      free(err);
      status = 2;
      goto out;
    }
  }
  berth_options ho;
  berth_options_init(&ho);
  ho.loop = loop;
  ho.hooks_file = hooks;
  ho.lib_dir = scripts;
  if (o.idle)
    ho.idle_timeout = o.idle;
  ho.daemon_url = cn.url;
  ho.daemon_token = cn.token;
  ho.minimum_isolation = o.min_iso ? o.min_iso : berth_default_floor(ho.daemon_url);
  ho.timeout_ms = CALL_TIMEOUT_MS;
  ho.model = model;
  ho.on_event = chat_event;
  ho.event_ud = &c;
  ho.log = chat_log;
  ho.log_ud = &c;
  if (o.store) {
    berth_error *se = berth_store_open(loop, o.store, &store);
    if (!se)
      se = berth_store_claim(store);   /* (alone on it: two chats would lose turns) */
    if (se) {
      fprintf(stderr, "berth chat: %s\n", se->message);
      if (!strcmp(se->code, "invalid_argument"))
        status = 2;             /* (a URL it cannot take: usage) */
      berth_error_free(se);
      goto out;
    }
    ho.store = store;
  }
  if (berth_host_new(&ho, &c.h, &err) != 0 || (o.approve && install_approve(&c, &err) != 0)) {
    fprintf(stderr, "berth chat: %s\n", err);
    free(err);
    goto out;
  }
  if (store) {
    if (chat_open_stored(&c, store) != 0)
      goto out;
  } else {
    char run_id[64];
    snprintf(run_id, sizeof run_id, "chat-%ld", (long)getpid());
    c.conv = berth_conv_new(c.h, run_id, NULL);
  }
  chat_banner(&c, o.model ? o.model : "none (--hooks)", &cn, &df);
  if (c.tty) {
    rl_catch_signals = 0;       /* the loop handles SIGINT (chat_sigint) */
    rl_readline_name = "berth";
    using_history();
    stifle_history(HISTORY_LINES);
    if ((c.history = history_path()))
      read_history(c.history);  /* none yet is fine */
  }
  ev_io_init(&c.in, chat_input, STDIN_FILENO, EV_READ);
  c.in.data = &c;
  ev_timer_init(&c.spin, on_spin, 0., SPIN_INTERVAL);
  c.spin.data = &c;
  watch_signal(loop, &c.sigint, chat_sigint, SIGINT, &c);
  watch_signal(loop, &c.sighup, chat_sighup, SIGHUP, &c);   /* reloads the hooks */
  watch_signal(loop, &c.sigterm, chat_sigterm, SIGTERM, &c);
  chat_listen(&c);
  ev_run(loop, 0);
  unwatch_signal(loop, &c.sigint);
  unwatch_signal(loop, &c.sighup);
  unwatch_signal(loop, &c.sigterm);
  ev_io_stop(loop, &c.in);
  ev_timer_stop(loop, &c.spin);
  spin_clear(&c);
  if (c.rl_on)
    rl_callback_handler_remove();
  if (c.history && write_history(c.history) == 0)
    history_truncate_file(c.history, HISTORY_LINES);
  status = c.terminated ? 128 + c.terminated : c.interrupted ? 130
         : berth_host_errors(c.h) ? 1 : 0;
  /* What the store still owes an answer (a suspend's commit, after which the ctx
   * leaves the Lua heap) is answered now: a store that closes drops its answers, and
   * the memory their callbacks would free.  (One iteration: the store's prepare.) */
  if (store) {
    berth_error_free(berth_store_flush(store));
    ev_run(loop, EVRUN_NOWAIT);
  }
out:
  if (c.conv)
    berth_conv_free(c.conv);
  berth_host_free(c.h);
  berth_store_free(store);      /* after the host: its last writes */
  berth_model_free(model);
  disconnect_daemon(&cn);
  berth_daemon_facts_clear(&df);
  free(c.history);
  free(c.buf);
  free(scripts);
  the_chat = NULL;
  ev_loop_destroy(loop);
  return status;
}

/* }====================================================== */

/* {====================================================== lua */

typedef struct lua_run {
  struct ev_loop *loop;
  berth_host *h;
  int status;
  conn *cn;
  ev_signal sigint, sigterm;
  ev_timer bound;               /* the disposal's after a signal (shut_down_within) */
  bool shut;                    /* the shutdown finished */
} lua_run;

static void lua_shut(void *ud)
{
  lua_run *r = ud;
  r->shut = true;
  ev_break(r->loop, EVBREAK_ALL);
}

static void lua_done(void *ud, int status)
{
  lua_run *r = ud;
  r->status = status;
  berth_host_shutdown(r->h, lua_shut, r);
}

/* SIGINT, SIGTERM: the sandboxes are disposed (within DISPOSE_LIMIT), the local
 * daemon stopped and its token file removed, as at the file's end; status 128 + the
 * signal.  A second one stops at once. */
static void lua_signal(struct ev_loop *loop, ev_signal *w, int revents)
{
  (void)revents;
  lua_run *r = w->data;
  if (r->status >= 128) {
    ev_break(loop, EVBREAK_ALL);
    return;
  }
  r->status = 128 + w->signum;
  shut_down_within(r->h, loop, &r->bound, lua_shut, r);
}

/* os.exit for berth lua: what the end of the file does first -- the sandboxes
 * disposed, the local daemon stopped, its token file removed -- then the exit, as
 * os.exit([code [, close]]) (busted ends with os.exit(1, true) when a spec fails).
 * The loop runs here, inside the call, until the disposal ended or DISPOSE_LIMIT
 * passed: nothing after os.exit may run, and the daemon's sessions must not outlive
 * the process until their idle timeout. */
static int lua_os_exit(lua_State *L)
{
  lua_run *r = lua_touserdata(L, lua_upvalueindex(1));
  int code = lua_isboolean(L, 1) ? (lua_toboolean(L, 1) ? EXIT_SUCCESS : EXIT_FAILURE)
                                 : (int)luaL_optinteger(L, 1, EXIT_SUCCESS);
  fflush(NULL);
  berth_host_shutdown(r->h, lua_shut, r);
  ev_now_update(r->loop);
  ev_tstamp deadline = ev_now(r->loop) + DISPOSE_LIMIT;
  while (!r->shut && ev_now(r->loop) < deadline)
    ev_run(r->loop, EVRUN_ONCE);
  disconnect_daemon(r->cn);
  fflush(NULL);
  _exit(code & 0xff);
}

static int cmd_lua(int argc, char **argv)
{
  opts o;
  int rc = parse_opts(argc, argv, lua_usage,
                      "daemon daemon-token-file token-file sandboxd provider model minimum-isolation verbose "
                      "help version", &o);
  if (rc >= 0)
    return rc;
  if (optind >= argc) {
    fprintf(stderr, "berth lua: give a FILE to run\n\n%s", lua_usage);
    return 2;
  }
  struct ev_loop *loop = ev_default_loop(0);
  char *scripts = berth_find_scripts_dir();
  lua_run r;
  memset(&r, 0, sizeof r);
  r.loop = loop;
  r.status = 1;
  char *err = NULL;
  berth_model *model = NULL;
  conn cn;
  if (connect_daemon(&o, &cn, true, false, "echo") < 0) {
    free(scripts);
    return 1;
  }
  r.cn = &cn;
  if (o.model) {
    berth_model_options mo = {loop, cn.provider, NULL, NULL};
    if (!(model = berth_model_new(o.model, &mo, &err))) {
      fprintf(stderr, "berth lua: %s\n", err);
      free(err);
      r.status = 2;
      goto out;
    }
  }
  berth_options ho;
  berth_options_init(&ho);
  ho.loop = loop;
  ho.unrestricted = true;
  ho.memory_limit = 0;
  ho.instruction_budget = 0;
  ho.lib_dir = scripts;
  ho.daemon_url = cn.url;
  ho.daemon_token = cn.token;
  ho.minimum_isolation = o.min_iso ? o.min_iso : berth_default_floor(ho.daemon_url);
  ho.model = model;
  ho.log = cli_log;
  ho.log_ud = &o;
  if (berth_host_new(&ho, &r.h, &err) != 0) {
    fprintf(stderr, "berth lua: %s\n", err);
    free(err);
    goto out;
  }
  {
    lua_State *L = berth_host_lua(r.h);
    lua_getglobal(L, "os");
    lua_pushlightuserdata(L, &r);
    lua_pushcclosure(L, lua_os_exit, 1);
    lua_setfield(L, -2, "exit");
    lua_pop(L, 1);
  }
  if (berth_run_file(r.h, argc - optind, argv + optind, lua_done, &r) != 0)
    goto out;
  ev_timer_init(&r.bound, stop_loop, DISPOSE_LIMIT, 0.);   /* (armed by shut_down_within) */
  watch_signal(loop, &r.sigint, lua_signal, SIGINT, &r);
  watch_signal(loop, &r.sigterm, lua_signal, SIGTERM, &r);
  ev_run(loop, 0);
  unwatch_signal(loop, &r.sigint);
  unwatch_signal(loop, &r.sigterm);
  ev_timer_stop(loop, &r.bound);
out:
  berth_host_free(r.h);
  berth_model_free(model);
  disconnect_daemon(&cn);
  free(scripts);
  ev_loop_destroy(loop);
  return r.status;
}

/* }====================================================== */

/* A descriptor among 0, 1, 2 that is closed is opened on /dev/null: else the next file
 * opened (a store, a token file, a socket) would take its number, and standard input
 * or output would be that file (`berth chat 0<&-` read its own store). */
static void open_standard_descriptors(void)
{
  for (int fd = 0; fd < 3; fd++)
    if (fcntl(fd, F_GETFD) < 0 && errno == EBADF &&
        open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY) < 0)
      break;                    /* (open takes the lowest free number: this one) */
}

int berth_cli_main(int argc, char **argv)
{
  open_standard_descriptors();
  plm_global_init();
  signal(SIGPIPE, SIG_IGN);
  if (argc < 2) {
    fputs(usage_text, stderr);
    return 2;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
    fputs(usage_text, stdout);
    return 0;
  }
  if (!strcmp(cmd, "--version")) {
    print_version();
    return 0;
  }
  int rc = -1;
  if (!strcmp(cmd, "replay"))
    rc = cmd_replay(argc - 1, argv + 1);
  else if (!strcmp(cmd, "chat"))
    rc = cmd_chat(argc - 1, argv + 1);
  else if (!strcmp(cmd, "lua"))
    rc = cmd_lua(argc - 1, argv + 1);
  if (rc >= 0) {
    /* A transcript that could not be written (a full disk, a closed pipe) is a
     * failure, whatever the run said. */
    if (fflush(stdout) != 0 || ferror(stdout)) {
      fprintf(stderr, "berth %s: the output could not be written: %s\n", cmd,
              strerror(errno ? errno : EIO));
      if (rc == 0)
        rc = 1;
    }
    return rc;
  }
  if (!strcmp(cmd, "serve"))
    return berth_cmd_serve(argc - 1, argv + 1);  /* serve.c */
  fprintf(stderr, "berth: unknown command \"%s\"\n\n%s", cmd, usage_text);
  return 2;
}
