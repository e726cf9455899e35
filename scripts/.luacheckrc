-- .luacheckrc — luacheck settings for berth hook scripts (and specs run by berth lua).
--   luacheck --config scripts/.luacheckrc scripts/ tests/spec/
-- The std "berth" names what the host adds to Lua 5.4's globals.  Hooks run in a
-- restricted environment (no os.execute, io.popen, package, debug beyond traceback,
-- string.dump, io.open for writing): luacheck cannot remove fields of the standard
-- library, so those are refused at run time instead (runtime/README.md).
stds.berth = {
  read_globals = {
    sandbox = {fields = {"executeCode", "warm", "dispose", "tool"}},
    model = {fields = {"chat"}},
    json = {fields = {"encode", "decode", "null", "array", "object", "isArray"}},
    log = {fields = {"debug", "info", "warn", "error"}},
    "sleep",
    "now",
  },
}
std = "lua54+berth"
max_line_length = 100

files["tests/spec/**/*_spec.lua"] = {std = "+busted", globals = {"sandbox", "model"}}
files["tests/spec/module.lua"] = {std = "lua54"}
