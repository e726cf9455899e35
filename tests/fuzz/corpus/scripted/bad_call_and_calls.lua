return { turns = { { user = "x", replies = { { call = { code = "1" }, calls = {} } } } } }
