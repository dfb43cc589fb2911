-- fence.lua: write only if my (incarnation, token) passes the fence (see
-- lock.h, FENCING; format.lua's lock_fence_admit, which the stock scripts
-- use inside their own steps too), admitting me at it.
-- KEYS[1] the resource's fence key, KEYS[2] the key to write
-- ARGV[1] token, ARGV[2] value, ARGV[3] incarnation (16 hex; all zeros:
-- unnamed, the fence then keeps the plain-integer form)
-- Returns {1, token} written, {0, highest} refused (a newer holder, or a
-- newer incarnation, was here; highest: the highest token of the newest).
if not tonumber(ARGV[1]) or not string.match(ARGV[1], '^%d+$') then
    return redis.error_reply('fence: token is not a number')
end
if not string.match(ARGV[3], '^%x+$') or #ARGV[3] ~= 16 then
    return redis.error_reply('fence: incarnation is not 16 hex digits')
end
if not lock_fence_admit(KEYS[1], ARGV[3], ARGV[1]) then
    local _, hi = lock_fence_parse(redis.call('get', KEYS[1]))
    return {0, hi}
end
redis.call('set', KEYS[2], ARGV[2])
return {1, tonumber(ARGV[1])}
