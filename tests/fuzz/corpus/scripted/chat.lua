return { turns = {
  { user = 'hello', replies = { { say = 'hi there' } } },
} }
