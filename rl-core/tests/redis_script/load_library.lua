-- Redis 7's FUNCTION LOAD for the tests (see the doc of LOAD_LIBRARY in
-- harness.rs): called with the library's text, returns its name, its
-- function of that name, its charge function (NAME_charge), its undo
-- function (NAME_undo), its lease function (NAME_lease) and its rl_conn
-- function (NAME_conn: give-backs and heartbeats).
local text = ...
local real = _G
local loading, registered = true, {}
local load_redis = {
  register_function = function(name, f)
    assert(registered[name] == nil, 'a function registered twice')
    registered[name] = f
  end,
}
local env = setmetatable({}, {
  __index = function(_, k)
    if loading then
      if k == 'redis' then return load_redis end
      error('Script attempted to access nonexistent global variable ' .. tostring(k), 2)
    end
    return real[k]
  end,
  __newindex = function(_, k) error('Attempt to modify a readonly table: ' .. tostring(k), 2) end,
})
-- Redis reads the "#!lua name=..." line itself and compiles the rest.
local name = string.match(text, '^#!lua name=([%w_]+)\n')
assert(name, 'no library name')
local chunk = assert(loadstring(string.sub(text, #name + 13), 'library'))
setfenv(chunk, env)
chunk()
loading = false
assert(registered[name], 'the library registers a function of its own name')
assert(registered[name .. '_charge'], 'the library registers its charge function')
assert(registered[name .. '_undo'], 'the library registers its undo function')
assert(registered[name .. '_lease'], 'the library registers its lease function')
assert(registered[name .. '_beat'], 'the library registers its heartbeat')
assert(registered[name .. '_conn'], "the library registers rl_conn's give-backs and heartbeats")
local n = 0
for _ in pairs(registered) do n = n + 1 end
assert(n == 6, 'the library registers its six functions, no more')
return name, registered[name], registered[name .. '_charge'], registered[name .. '_undo'], registered[name .. '_lease'],
  registered[name .. '_conn']
