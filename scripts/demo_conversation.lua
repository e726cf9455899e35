-- demo_conversation.lua — the conversation `make demo` replays (berth replay).
--
-- Turn 1 defines a variable and writes a file; turn 2 uses both (same sandbox, same
-- interpreter) and makes a cell fail, which the model sees as a result; then the
-- conversation idles, its idle timer suspends it and its sandbox is disposed; turn 3
-- finds a fresh sandbox (freshSandbox), sees what was lost and rebuilds; the
-- conversation completes and the sandbox is disposed again.
--
-- Expectations outside a provider block hold for every provider.  `echo` blocks hold
-- for sandboxd's echo provider (it runs nothing and answers "python <n>: <code>"),
-- `real` blocks for providers that run Python (bwrap, gvisor, process).
return {
  title = "a variable and a file, across turns and a suspend",
  runId = "demo-run-1",
  turns = {
    {
      user = "Remember 41 as x, and write a note saying so.",
      replies = {
        { say = "I'll keep x in the sandbox and write notes.txt.",
          call = {
            language = "python",
            code = [[
x = 41
with open("notes.txt", "w") as f:
    f.write("x is 41\n")]],
            expect = {
              exitCode = 0, stateKept = true, filesPersist = true,
              freshSandbox = true, freshInterpreter = true,
              echo = { stdoutContains = "python 1: x = 41" },
              real = { stdout = "" },
            },
          } },
        { say = "Done: x is 41 and notes.txt holds the note." },
      },
    },
    {
      user = "What is x + 1, and what does the note say?",
      replies = {
        { call = {
            language = "python",
            code = [[
print(x + 1)
print(open("notes.txt").read(), end="")]],
            expect = {
              exitCode = 0, stateKept = true,
              freshSandbox = false, freshInterpreter = false,
              echo = { stdoutContains = "python 2: print(x + 1)" },
              real = { stdout = "42\nx is 41\n" },
            },
          } },
        -- A guest error is a result for the model, not an agent error: the cell fails,
        -- the interpreter and its state live on.
        { say = "x + 1 is 42, and the note says \"x is 41\". Dividing x by zero:",
          call = {
            language = "python",
            code = "x / 0",
            expect = {
              stateKept = true, freshSandbox = false, freshInterpreter = false,
              echo = { exitCode = 0, stdoutContains = "python 3: x / 0" },
              real = { exitCode = 1, stderrContains = "ZeroDivisionError" },
            },
          } },
        { say = "That raises ZeroDivisionError, and x is still 41." },
      },
    },
    -- No message for a while: the idle timer (idleTimeout, 3 s in replay) suspends the
    -- conversation and onSuspend disposes the sandbox.  `idle = true` would suspend at
    -- once instead.
    { idle = "wait" },
    {
      user = "Is x still 41?",
      replies = {
        { say = "Let me check.",
          call = {
            language = "python",
            code = [[
import os
print(os.path.exists("notes.txt"))
print(x)]],
            expect = {
              freshSandbox = true, freshInterpreter = true, stateKept = true,
              echo = { exitCode = 0, stdoutContains = "python 1: import os" },
              real = { exitCode = 1, stdout = "False\n", stderrContains = "NameError" },
            },
          } },
        { say = "The sandbox is fresh: x and the note are gone. Rebuilding both.",
          call = {
            language = "python",
            code = [[
x = 41
with open("notes.txt", "w") as f:
    f.write("x is 41\n")
x]],
            expect = {
              exitCode = 0, stateKept = true,
              freshSandbox = false, freshInterpreter = false,
              echo = { stdoutContains = "python 2: x = 41" },
              real = { stdout = "41\n" },
            },
          } },
        { say = "Rebuilt: x is 41 again and notes.txt is back." },
      },
    },
  },
}
