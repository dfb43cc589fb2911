-- fence.lua: write only if my token >= the highest seen (see lock.h,
-- FENCING: the stock scripts make the same check inside their own step).
-- KEYS[1] the resource's highest-token key, KEYS[2] the key to write
-- ARGV[1] token, ARGV[2] value
-- Returns {1, token} written, {0, highest} refused (a newer holder wrote).
local tok = tonumber(ARGV[1])
if not tok then return redis.error_reply('fence: token is not a number') end
local hi = tonumber(redis.call('get', KEYS[1])) or 0
if tok < hi then return {0, hi} end
if tok > hi then redis.call('set', KEYS[1], ARGV[1]) end
redis.call('set', KEYS[2], ARGV[2])
return {1, tok}
