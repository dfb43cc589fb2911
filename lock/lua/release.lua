-- release.lua: compare-and-delete, then wake the next live waiter. The
-- marker published first (ARGV[2], the bare wake prefix) tells clients that
-- watch the key's keyspace notifications that this DEL is one of ours, whose
-- queue wakes a waiter below; they ignore its del event.
-- KEYS[1] lock, KEYS[2] waiter queue
-- ARGV[1] id, ARGV[2] wake channel prefix, ARGV[3] live waiters to wake
-- Returns 1 released, 0 not ours (expired, or someone else's lock).
local v = redis.call('get', KEYS[1])
if not v or string.sub(v, 1, #ARGV[1] + 1) ~= ARGV[1] .. ':' then
    return 0
end
redis.call('publish', ARGV[2], 'released')
redis.call('del', KEYS[1])
-- Waiters whose PUBLISH reaches nobody have gone; they are dropped, but at
-- most 64 per release, so a queue of dead entries cannot stall Redis.
local want, woke = tonumber(ARGV[3]), 0
for _ = 1, 64 do
    if woke >= want then break end
    local head = redis.call('zpopmin', KEYS[2])
    if #head == 0 then break end
    if redis.call('publish', ARGV[2] .. head[1], 'released') > 0 then
        woke = woke + 1
    end
end
return 1
