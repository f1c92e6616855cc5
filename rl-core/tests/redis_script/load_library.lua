-- Redis 7's FUNCTION LOAD for the tests (see the doc of LOAD_LIBRARY in
-- harness.rs): called with the library's text, returns its name and function.
local text = ...
local real = _G
local loading, registered = true, nil
local load_redis = {
  register_function = function(name, f) registered = { name, f } end,
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
assert(registered and registered[1] == name, 'the library registers a function of its own name')
return registered[1], registered[2]
