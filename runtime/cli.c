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
#include "runtime.h"
#include "model.h"

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define REPLAY_IDLE_TIMEOUT 3.0
#define REPLAY_TIME_LIMIT 600.0
#define CALL_TIMEOUT_MS 30000   /* per executeCode call, as the example agent (H16) */

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
  "  --daemon URL             use this plimsoll daemon (with --token-file) instead of\n"
  "                           starting a local sandboxd\n"
  "  --token-file FILE        the daemon's bearer token (first line)\n"
  "  --sandboxd PATH          the sandboxd to start (default: $BERTH_SANDBOXD, the one\n"
  "                           next to berth, else PATH)\n"
  "  --provider NAME          the local sandboxd's provider (default $BERTH_PROVIDER, else\n"
  "                           echo); also selects the script's provider expectations\n"
  "                           (by default the provider a daemon's Describe names)\n"
  "  --hooks FILE             the hooks (default: the shipped code_chat.lua)\n"
  "  --idle-timeout SECONDS   idle time before a conversation suspends (default: the\n"
  "                           script's idleTimeout, else 3)\n"
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
  "conversation, /quit (or end of input) completes it.  Tool calls and their results\n"
  "are shown as they happen.\n"
  "\n"
  "  --model SPEC             the model: scripted:FILE, or openai[:NAME] (an OpenAI-\n"
  "                           compatible server: BERTH_MODEL_URL, BERTH_API_KEY,\n"
  "                           BERTH_MODEL; see berth(1))\n"
  "  --hooks FILE             the hooks (default: the shipped code_chat.lua)\n"
  "  --daemon URL, --token-file FILE\n"
  "                           a running daemon (default: $PLIMSOLL_URL and\n"
  "                           $PLIMSOLL_TOKEN, else a local sandboxd)\n"
  "  --sandboxd PATH, --provider NAME\n"
  "                           the local sandboxd (as for replay)\n"
  "  --idle-timeout SECONDS   idle time before the conversation suspends (default 30)\n"
  "  --minimum-isolation TIER (default container over http, kernel over https)\n"
  "  --verbose, --help, --version\n";

static const char lua_usage[] =
  "usage: berth lua [options] FILE [ARGS...]\n"
  "\n"
  "Runs FILE as a coroutine with the full standard library and berth's modules (json,\n"
  "sandbox, model, log, sleep, now), so natives that wait work at its top level:\n"
  "  berth lua /usr/bin/busted spec/\n"
  "The shipped scripts directory is on package.path.  Options come before FILE.\n"
  "\n"
  "  --daemon URL, --token-file FILE\n"
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
  bool verbose, start_local;
} opts;

enum {
  O_DAEMON = 256, O_TOKEN_FILE, O_SANDBOXD, O_PROVIDER, O_HOOKS, O_MODEL, O_IDLE, O_MIN_ISO,
  O_TIME_LIMIT, O_VERBOSE, O_HELP, O_VERSION
};

static const struct option long_opts[] = {
  {"daemon", required_argument, NULL, O_DAEMON},
  {"token-file", required_argument, NULL, O_TOKEN_FILE},
  {"sandboxd", required_argument, NULL, O_SANDBOXD},
  {"provider", required_argument, NULL, O_PROVIDER},
  {"hooks", required_argument, NULL, O_HOOKS},
  {"model", required_argument, NULL, O_MODEL},
  {"idle-timeout", required_argument, NULL, O_IDLE},
  {"minimum-isolation", required_argument, NULL, O_MIN_ISO},
  {"time-limit", required_argument, NULL, O_TIME_LIMIT},
  {"verbose", no_argument, NULL, O_VERBOSE},
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
  while ((c = getopt_long(argc, argv, "+", long_opts, NULL)) != -1) {
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
      case O_MIN_ISO: o->min_iso = optarg; break;
      case O_VERBOSE: o->verbose = true; break;
      case O_IDLE:
        if (!parse_seconds(optarg, &o->idle)) {
          fprintf(stderr, "berth %s: --idle-timeout needs seconds >= 0\n", argv[0]);
          return 2;
        }
        break;
      case O_TIME_LIMIT:
        if (!parse_seconds(optarg, &o->time_limit) || o->time_limit == 0) {
          fprintf(stderr, "berth %s: --time-limit needs seconds > 0\n", argv[0]);
          return 2;
        }
        break;
      case O_HELP: fputs(usage, stdout); return 0;
      case O_VERSION: print_version(); return 0;
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
  char line[1024];
  char *tok = NULL;
  while (fgets(line, sizeof line, f)) {
    char *s = line;
    while (*s == ' ' || *s == '\t')
      s++;
    size_t n = strcspn(s, "\r\n");
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t'))
      n--;
    s[n] = '\0';
    if (n && s[0] != '#') {
      tok = strdup(s);
      break;
    }
  }
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
 * local sandboxd (if allowed).  Returns 0, 1 for "none", or -1 on error. */
static int connect_daemon(const opts *o, conn *c, bool use_env, bool start_local)
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
  if (use_env && getenv("PLIMSOLL_URL") && *getenv("PLIMSOLL_URL") && !o->start_local) {
    c->url = getenv("PLIMSOLL_URL");
    if (getenv("PLIMSOLL_TOKEN"))
      c->token = strdup(getenv("PLIMSOLL_TOKEN"));
    c->provider = o->provider;
    return 0;
  }
  if (!start_local && !o->start_local && !o->provider)
    return 1;
  const char *provider = o->provider;
  if (!provider)
    provider = getenv("BERTH_PROVIDER") && *getenv("BERTH_PROVIDER") ? getenv("BERTH_PROVIDER")
                                                                     : "echo";
  if (berth_daemon_start(&c->local, o->sandboxd, provider, o->verbose) != 0)
    return -1;
  berth_daemon_watch(&c->local, ev_default_loop(0));  /* started again if it dies */
  c->own = true;
  c->url = c->local.url;
  c->token = strdup(c->local.token);
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
  ev_timer limit;
  bool timed_out;
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
  berth_host_shutdown(r->h, replay_shut, r);
}

static void replay_event(void *ud, berth_conv *c, const char *kind, const json_t *data)
{
  (void)c;
  replay *r = ud;
  berth_transcript_event(&r->tr, kind, data);
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
    fprintf(r->tr.out, "== idle%s ==\n", json_is_true(idle) ? "" : " (waiting for the idle timeout)");
    r->want_suspend = true;
    if (json_is_true(idle))
      berth_conv_suspend(r->conv);
    return;
  }
  fprintf(r->tr.out, "\n== turn %u ==\n", ++r->turns_played);
  berth_conv_send(r->conv, json_string_value(json_object_get(turn, "user")));
}

static void replay_limit(struct ev_loop *loop, ev_timer *w, int revents)
{
  (void)revents;
  replay *r = w->data;
  fprintf(stderr, "berth replay: gave up after %.0f s (--time-limit)\n", r->o->time_limit);
  r->timed_out = true;
  ev_break(loop, EVBREAK_ALL);
}

typedef struct describe_wait {
  bool done;
  char *sandbox;
  char *error;
} describe_wait;

static void on_describe(void *ud, plm_error *err, plm_info *info)
{
  describe_wait *d = ud;
  d->done = true;
  if (err) {
    d->error = strdup(err->message);
    plm_error_free(err);
  } else {
    d->sandbox = info->sandbox ? strdup(info->sandbox) : NULL;
    plm_info_free(info);
  }
}

/* The provider a daemon names in Describe (also a first check that it answers). */
static char *describe_provider(berth_host *h, struct ev_loop *loop)
{
  describe_wait d = {false, NULL, NULL};
  plm_error *e = plm_describe(h->client, NULL, on_describe, &d);
  if (e) {
    fprintf(stderr, "berth: Describe: %s\n", e->message);
    plm_error_free(e);
    return NULL;
  }
  while (!d.done)
    ev_run(loop, EVRUN_ONCE);
  if (d.error) {
    fprintf(stderr, "berth: the daemon did not answer Describe: %s\n", d.error);
    free(d.error);
  }
  return d.sandbox;
}

static int cmd_replay(int argc, char **argv)
{
  opts o;
  int rc = parse_opts(argc, argv, replay_usage,
                      "daemon token-file sandboxd provider hooks idle-timeout "
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
  if (!o.idle) {
    const json_t *it = json_object_get(script, "idleTimeout");
    o.idle = json_is_number(it) ? json_number_value(it) : REPLAY_IDLE_TIMEOUT;
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
  if (connect_daemon(&o, &c, false, true) != 0) {
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
  ho.idle_timeout = o.idle;
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
    char *p = describe_provider(r.h, loop);
    if (!p)
      goto out;
    berth_scripted_set_provider(r.model, p);
    c.provider = NULL;
    free(p);
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
  ev_timer_start(loop, &r.limit);
  ev_unref(loop);               /* the limit alone keeps nothing alive */
  replay_step(&r);
  ev_run(loop, 0);
  ev_ref(loop);
  ev_timer_stop(loop, &r.limit);

  unsigned checked, failed;
  berth_scripted_finish(r.model, &checked, &failed);
  unsigned errors = berth_host_errors(r.h);
  printf("\nreplay: %u turn%s, %u check%s, %u failed, %u hook error%s%s\n", r.turns_played,
         r.turns_played == 1 ? "" : "s", checked, checked == 1 ? "" : "s", failed, errors,
         errors == 1 ? "" : "s", r.timed_out ? ", timed out" : "");
  status = failed || errors || r.timed_out ? 1 : 0;
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

typedef struct chat {
  struct ev_loop *loop;
  berth_host *h;
  berth_conv *conv;
  berth_transcript tr;
  ev_io in;
  ev_signal sigint;
  char buf[65536];
  size_t len;
  bool tty, ending;
} chat;

static void chat_prompt(chat *c)
{
  if (c->tty && !c->ending) {
    fputs("you> ", stdout);
    fflush(stdout);
  }
}

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
  ev_io_stop(c->loop, &c->in);
  berth_conv_complete(c->conv, chat_completed, c);
}

static void chat_event(void *ud, berth_conv *conv, const char *kind, const json_t *data)
{
  (void)conv;
  chat *c = ud;
  berth_transcript_event(&c->tr, kind, data);
  if (strcmp(kind, "turnEnd") == 0 && !berth_conv_busy(c->conv))
    chat_prompt(c);
}

static void chat_line(chat *c, const char *line)
{
  if (strcmp(line, "/quit") == 0 || strcmp(line, "/exit") == 0)
    chat_end(c);
  else if (strcmp(line, "/suspend") == 0)
    berth_conv_suspend(c->conv);
  else if (strcmp(line, "/help") == 0) {
    puts("/suspend  suspend now (as if idle)\n/quit     complete the conversation and exit");
    chat_prompt(c);
  } else if (*line)
    berth_conv_send(c->conv, line);
  else
    chat_prompt(c);
}

static void chat_input(struct ev_loop *loop, ev_io *w, int revents)
{
  (void)loop;
  (void)revents;
  chat *c = w->data;
  ssize_t n = read(STDIN_FILENO, c->buf + c->len, sizeof c->buf - 1 - c->len);
  if (n <= 0) {
    if (n < 0 && errno == EINTR)
      return;
    if (c->len) {
      c->buf[c->len] = '\0';
      chat_line(c, c->buf);
      c->len = 0;
    }
    chat_end(c);
    return;
  }
  c->len += (size_t)n;
  char *start = c->buf, *nl;
  while (!c->ending && (nl = memchr(start, '\n', c->len - (size_t)(start - c->buf)))) {
    *nl = '\0';
    if (nl > start && nl[-1] == '\r')
      nl[-1] = '\0';
    chat_line(c, start);
    start = nl + 1;
  }
  c->len -= (size_t)(start - c->buf);
  memmove(c->buf, start, c->len);
  if (c->len == sizeof c->buf - 1) {  /* a line longer than the buffer: send it as is */
    c->buf[c->len] = '\0';
    chat_line(c, c->buf);
    c->len = 0;
  }
}

static void chat_sigint(struct ev_loop *loop, ev_signal *w, int revents)
{
  (void)loop;
  (void)revents;
  chat *c = w->data;
  if (c->ending)
    ev_break(c->loop, EVBREAK_ALL);   /* a second ^C: stop now */
  chat_end(c);
}

static int cmd_chat(int argc, char **argv)
{
  opts o;
  int rc = parse_opts(argc, argv, chat_usage,
                      "model hooks daemon token-file sandboxd provider idle-timeout "
                      "minimum-isolation verbose help version", &o);
  if (rc >= 0)
    return rc;
  if (optind != argc) {
    fprintf(stderr, "berth chat: unexpected argument %s\n\n%s", argv[optind], chat_usage);
    return 2;
  }
  struct ev_loop *loop = ev_default_loop(0);
  char *scripts = berth_find_scripts_dir();
  char hooks[4096];
  if (o.hooks)
    snprintf(hooks, sizeof hooks, "%s", o.hooks);
  else if (scripts)
    snprintf(hooks, sizeof hooks, "%s/code_chat.lua", scripts);
  else {
    fprintf(stderr, "berth chat: cannot find the shipped scripts (set BERTH_SCRIPTS, or "
                    "give --hooks)\n");
    return 2;
  }
  chat c;
  memset(&c, 0, sizeof c);
  c.loop = loop;
  c.tr.out = stdout;
  c.tr.streaming = true;
  c.tty = isatty(STDIN_FILENO);
  int status = 1;
  char *err = NULL;
  berth_model *model = NULL;
  conn cn;
  if (connect_daemon(&o, &cn, true, true) != 0) {
    free(scripts);
    return 1;
  }
  if (o.model) {
    berth_model_options mo = {loop, cn.provider, NULL, NULL};
    model = berth_model_new(o.model, &mo, &err);
    if (!model) {
      fprintf(stderr, "berth chat: %s\n", err);
      free(err);
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
  ho.log = cli_log;
  ho.log_ud = &o;
  ho.handle_sighup = true;
  if (berth_host_new(&ho, &c.h, &err) != 0) {
    fprintf(stderr, "berth chat: %s\n", err);
    free(err);
    goto out;
  }
  char run_id[64];
  snprintf(run_id, sizeof run_id, "chat-%ld", (long)getpid());
  c.conv = berth_conv_new(c.h, run_id, NULL);
  if (c.tty)
    printf("berth chat (%s) — /help for commands\n", model ? o.model : "no model: --model");
  ev_io_init(&c.in, chat_input, STDIN_FILENO, EV_READ);
  c.in.data = &c;
  ev_io_start(loop, &c.in);
  ev_signal_init(&c.sigint, chat_sigint, SIGINT);
  c.sigint.data = &c;
  ev_signal_start(loop, &c.sigint);
  ev_unref(loop);
  chat_prompt(&c);
  ev_run(loop, 0);
  ev_ref(loop);
  ev_signal_stop(loop, &c.sigint);
  ev_io_stop(loop, &c.in);
  status = berth_host_errors(c.h) ? 1 : 0;
out:
  if (c.conv)
    berth_conv_free(c.conv);
  berth_host_free(c.h);
  berth_model_free(model);
  disconnect_daemon(&cn);
  free(scripts);
  ev_loop_destroy(loop);
  return status;
}

/* }====================================================== */

/* {====================================================== lua */

typedef struct lua_run {
  struct ev_loop *loop;
  berth_host *h;
  int status;
} lua_run;

static void lua_shut(void *ud)
{
  lua_run *r = ud;
  ev_break(r->loop, EVBREAK_ALL);
}

static void lua_done(void *ud, int status)
{
  lua_run *r = ud;
  r->status = status;
  berth_host_shutdown(r->h, lua_shut, r);
}

static int cmd_lua(int argc, char **argv)
{
  opts o;
  int rc = parse_opts(argc, argv, lua_usage,
                      "daemon token-file sandboxd provider model minimum-isolation verbose "
                      "help version", &o);
  if (rc >= 0)
    return rc;
  if (optind >= argc) {
    fprintf(stderr, "berth lua: give a FILE to run\n\n%s", lua_usage);
    return 2;
  }
  struct ev_loop *loop = ev_default_loop(0);
  char *scripts = berth_find_scripts_dir();
  lua_run r = {loop, NULL, 1};
  char *err = NULL;
  berth_model *model = NULL;
  conn cn;
  if (connect_daemon(&o, &cn, true, false) < 0) {
    free(scripts);
    return 1;
  }
  if (o.model) {
    berth_model_options mo = {loop, cn.provider, NULL, NULL};
    if (!(model = berth_model_new(o.model, &mo, &err))) {
      fprintf(stderr, "berth lua: %s\n", err);
      free(err);
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
  if (berth_run_file(r.h, argc - optind, argv + optind, lua_done, &r) != 0)
    goto out;
  ev_run(loop, 0);
out:
  berth_host_free(r.h);
  berth_model_free(model);
  disconnect_daemon(&cn);
  free(scripts);
  ev_loop_destroy(loop);
  return r.status;
}

/* }====================================================== */

int berth_cli_main(int argc, char **argv)
{
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
  if (!strcmp(cmd, "replay"))
    return cmd_replay(argc - 1, argv + 1);
  if (!strcmp(cmd, "chat"))
    return cmd_chat(argc - 1, argv + 1);
  if (!strcmp(cmd, "lua"))
    return cmd_lua(argc - 1, argv + 1);
  if (!strcmp(cmd, "serve"))
    return berth_cmd_serve(argc - 1, argv + 1);  /* serve.c */
  fprintf(stderr, "berth: unknown command \"%s\"\n\n%s", cmd, usage_text);
  return 2;
}
