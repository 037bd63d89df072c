"""The Redis store's Lua scripts. Each one touches only the keys it is given in KEYS.

A script that names a key it was not given works on one server and fails with CROSSSLOT
(or silently touches another node's key space) on a cluster, so none builds a key name
itself: the client passes every key, all in one slot (proxy/store/redis_layout.py).
"""

from __future__ import annotations

# Renew/release only if the caller still holds the lock (its token is the stored value).
RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""

# A counted put, atomic: store the blob, make it the group's newest, add its size, and evict
# the group's oldest blobs while it holds more than the quota (never the one just stored).
# KEYS: the blob, the group's order (sorted set), sizes (hash) and meta ({bytes, seq} hash),
# then the blobs of members the caller expects to be evicted; ARGV[7..] are those members,
# one per extra key. The script first works out, without writing, which members the put
# evicts; if one of their blobs was not passed, it writes nothing and returns those members
# and the ARGV[6] next-oldest after them (as an array), for the caller to pass and call
# again (a concurrent put may have evicted some by then). Otherwise it does the put and
# returns the count evicted. The bookkeeping lives as long as the longest-lived blob stored into it.
PUT_COUNTED = """
local blob, order, sizes, meta = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local value, ttl, quota, member, max_evict = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5])
local slack = tonumber(ARGV[6])
local given = {}
for i = 5, #KEYS do given[ARGV[i + 2]] = KEYS[i] end
local size = string.len(value)
local old = tonumber(redis.call('HGET', sizes, member) or '0')
local used = tonumber(redis.call('HGET', meta, 'bytes') or '0') + size - old
local doomed, missing = {}, false
if used > quota then
    local oldest = redis.call('ZRANGE', order, 0, max_evict + slack)
    local i = 1
    while i <= #oldest and used > quota and #doomed < max_evict do
        local m = oldest[i]
        if m ~= member then
            used = used - tonumber(redis.call('HGET', sizes, m) or '0')
            doomed[#doomed + 1] = m
            if not given[m] then missing = true end
        end
        i = i + 1
    end
    if missing then
        local ask = {unpack(doomed)}
        while i <= #oldest and #ask < #doomed + slack do
            if oldest[i] ~= member then ask[#ask + 1] = oldest[i] end
            i = i + 1
        end
        return ask
    end
end
local existed = redis.call('EXISTS', order) == 1
if ttl == '' then redis.call('SET', blob, value) else redis.call('SET', blob, value, 'PX', ttl) end
redis.call('ZADD', order, redis.call('HINCRBY', meta, 'seq', 1), member)
redis.call('HSET', sizes, member, size)
redis.call('HSET', meta, 'bytes', used)
for _, m in ipairs(doomed) do
    redis.call('DEL', given[m])
    redis.call('ZREM', order, m)
    redis.call('HDEL', sizes, m)
end
if ttl == '' then
    for i = 2, 4 do redis.call('PERSIST', KEYS[i]) end
else
    local left = redis.call('PTTL', order)
    if not (existed and left == -1) and left < tonumber(ttl) then
        for i = 2, 4 do redis.call('PEXPIRE', KEYS[i], ttl) end
    end
end
return #doomed
"""

# Appends to the logs of one slot, atomic: ARGV[1] max_len ('' none), ARGV[2] ttl in ms
# ('' none), then (index into KEYS, value) pairs in order. Each log keeps its newest
# max_len entries and gets the whole log's expiry, as one append per entry would leave it.
APPEND_LOGS = """
local max_len, ttl = ARGV[1], ARGV[2]
for i = 3, #ARGV, 2 do redis.call('RPUSH', KEYS[tonumber(ARGV[i])], ARGV[i + 1]) end
for _, k in ipairs(KEYS) do
    if max_len ~= '' then redis.call('LTRIM', k, -tonumber(max_len), -1) end
    if ttl ~= '' then redis.call('PEXPIRE', k, ttl) end
end
return 1
"""
