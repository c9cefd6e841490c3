"""The Lua scripts of the Store on Redis (service.store.redis): each runs atomically in Redis.

They name keys by the layout that module describes. Under maxmemory, Redis refuses a script's
write only while the script has written nothing yet, so none is left half done.
"""

# Publishes an uploaded version: all of its chunks must still be there (0 otherwise). Pending
# (ARGV[7] > 0), it expires, and leaves a blob already there as it is (2). KEYS: meta, index.
# ARGV: chunk key prefix, blob key, version, chunk count, size, grace seconds, pending ms.
PUBLISH_BLOB = """
local n = tonumber(ARGV[4])
for i = 0, n - 1 do
  if redis.call('EXISTS', ARGV[1] .. ARGV[3] .. ':' .. i) == 0 then return 0 end
end
local pending = tonumber(ARGV[7])
if pending > 0 and redis.call('EXISTS', KEYS[1]) == 1 then
  for i = 0, n - 1 do redis.call('UNLINK', ARGV[1] .. ARGV[3] .. ':' .. i) end
  return 2
end
for i = 0, n - 1 do
  if pending > 0 then
    redis.call('PEXPIRE', ARGV[1] .. ARGV[3] .. ':' .. i, pending)
  else
    redis.call('PERSIST', ARGV[1] .. ARGV[3] .. ':' .. i)
  end
end
local old = redis.call('HMGET', KEYS[1], 'ver', 'chunks')
if old[1] then
  for i = 0, tonumber(old[2]) - 1 do
    redis.call('EXPIRE', ARGV[1] .. old[1] .. ':' .. i, ARGV[6])
  end
end
redis.call('HSET', KEYS[1], 'ver', ARGV[3], 'chunks', n, 'size', ARGV[5])
if pending > 0 then
  redis.call('PEXPIRE', KEYS[1], pending)
else
  redis.call('PERSIST', KEYS[1])
  redis.call('ZADD', KEYS[2], 0, ARGV[2])
end
return 1
"""

# Removes the chunks of a put_blob that failed, unless its publish ran after all (its reply lost
# to a timeout): then they are the blob's. KEYS: meta. ARGV: chunk key prefix, version, count.
DROP_CHUNKS = """
if redis.call('HGET', KEYS[1], 'ver') == ARGV[2] then return 0 end
for i = 0, tonumber(ARGV[3]) - 1 do redis.call('UNLINK', ARGV[1] .. ARGV[2] .. ':' .. i) end
return 1
"""

# Makes a pending blob permanent; 0 when there is none. KEYS: meta, index. ARGV: prefix, blob key.
KEEP_BLOB = """
local ttl = redis.call('PTTL', KEYS[1])
if ttl == -2 then return 0 end
if ttl == -1 then return 1 end
local ver = redis.call('HMGET', KEYS[1], 'ver', 'chunks')
for i = 0, tonumber(ver[2]) - 1 do redis.call('PERSIST', ARGV[1] .. ver[1] .. ':' .. i) end
redis.call('PERSIST', KEYS[1])
redis.call('ZADD', KEYS[2], 0, ARGV[2])
return 1
"""

# Deletes a pending blob; a kept one (no expiry) stays. KEYS: meta. ARGV: chunk key prefix.
DISCARD_BLOB = """
if redis.call('PTTL', KEYS[1]) < 0 then return 0 end
local ver = redis.call('HMGET', KEYS[1], 'ver', 'chunks')
for i = 0, tonumber(ver[2]) - 1 do redis.call('UNLINK', ARGV[1] .. ver[1] .. ':' .. i) end
redis.call('UNLINK', KEYS[1])
return 1
"""

# KEYS: meta, index. ARGV: chunk key prefix, blob key.
DELETE_BLOB = """
local old = redis.call('HMGET', KEYS[1], 'ver', 'chunks')
if old[1] then
  for i = 0, tonumber(old[2]) - 1 do redis.call('UNLINK', ARGV[1] .. old[1] .. ':' .. i) end
end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[2])
"""

# KEYS: doc, index. ARGV: id, then field/value pairs.
CREATE_DOC = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('ZADD', KEYS[2], 0, ARGV[1])
return 1
"""

# KEYS: doc. ARGV: field/value pairs.
UPDATE_DOC = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1
"""
