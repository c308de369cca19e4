"""The Lua scripts of RedisEntryStore (kvgate.index.responses.entries.redis), one per write or
compound read: each runs atomically in Redis, so an entry, its vector, its exact pointer, its index
terms and its change-log record are never seen apart. KEYS and ARGV of each are listed above it;
the key layout they work on is described in the store's module.
"""

_LOG = """
local function log(op, id)
  local n = redis.call('INCR', KEYS[#KEYS - 1])
  redis.call('XADD', KEYS[#KEYS], 'MAXLEN', '~', ARGV[#ARGV], '*', 'op', op, 'id', id, 'n', n)
end
"""
# KEYS: entry, pointer, seq, log; ARGV: id, j, v ('' = none), k ('' = none), ttl ms ('0' = none),
# terms (newline separated, '' = none), term-set prefix, log_max
PUT = (
    _LOG
    + """
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[1], 'j', ARGV[2], 'k', ARGV[4], 'v', ARGV[3])
else
  redis.call('HSET', KEYS[1], 'j', ARGV[2], 'k', ARGV[4])
end
local ttl = tonumber(ARGV[5])
if ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl) end
if ARGV[6] ~= '' then
  redis.call('HSET', KEYS[1], 'g', ARGV[6])
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local score = '+inf'
  if ttl > 0 then score = now + ttl end
  for term in string.gmatch(ARGV[6], '[^\\n]+') do
    local set = ARGV[7] .. term
    redis.call('ZREMRANGEBYSCORE', set, '-inf', '(' .. now)
    local left = redis.call('PTTL', set)
    redis.call('ZADD', set, score, ARGV[1])
    if ttl == 0 then redis.call('PERSIST', set)
    elseif left == -2 or (left >= 0 and left < ttl) then redis.call('PEXPIRE', set, ttl) end
  end
end
if ARGV[4] ~= '' then
  if ttl > 0 then redis.call('SET', KEYS[2], ARGV[1], 'PX', ttl) else redis.call('SET', KEYS[2], ARGV[1]) end
end
log('a', ARGV[1])
return 1
"""
)
# KEYS: entry, seq, log; ARGV: id, pointer prefix, term-set prefix, log_max
DELETE = (
    _LOG
    + """
local g = redis.call('HGET', KEYS[1], 'g')
if g then
  for term in string.gmatch(g, '[^\\n]+') do redis.call('ZREM', ARGV[3] .. term, ARGV[1]) end
end
local k = redis.call('HGET', KEYS[1], 'k')
if k and k ~= '' then
  local ptr = ARGV[2] .. k
  if redis.call('GET', ptr) == ARGV[1] then redis.call('DEL', ptr) end
end
if redis.call('DEL', KEYS[1]) == 0 then return 0 end
log('d', ARGV[1])
return 1
"""
)
# KEYS: entry; ARGV: j — only while the entry lives (never resurrects; keeps its expiry)
REWRITE = "if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end redis.call('HSET', KEYS[1], 'j', ARGV[1]) return 1"
# KEYS: pointer; ARGV: id — compare-and-delete
UNPOINT = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
# KEYS: pointer; ARGV: entry prefix — pointer and entry in one round trip
EXACT = """
local id = redis.call('GET', KEYS[1])
if not id then return false end
return {id, redis.call('HGET', ARGV[1] .. id, 'j') or false}
"""
# KEYS: counter; ARGV: base, n
ALLOCATE = "if redis.call('EXISTS', KEYS[1]) == 0 then redis.call('SET', KEYS[1], ARGV[1]) end return redis.call('INCRBY', KEYS[1], ARGV[2])"
# KEYS: epoch, log; ARGV: a fresh epoch token
POSITION = """
redis.call('SET', KEYS[1], ARGV[1], 'NX')
local last = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
if #last == 0 then return {redis.call('GET', KEYS[1]), '0-0', '0'} end
local f = last[1][2]
local n = '0'
for i = 1, #f, 2 do if f[i] == 'n' then n = f[i + 1] end end
return {redis.call('GET', KEYS[1]), last[1][1], n}
"""
# KEYS: epoch, log; ARGV: after (stream id), count
READ = """
local rows = redis.call('XRANGE', KEYS[2], '(' .. ARGV[1], '+', 'COUNT', ARGV[2])
return {redis.call('GET', KEYS[1]) or false, rows}
"""
