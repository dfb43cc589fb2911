-- read.lua: the read half of the read-check-write strategies (lock, local,
-- unsafe-*). It only reads, so the check that follows in C can be raced by
-- other writers: that is the point of those strategies, and what a lock
-- around read, check and write must prevent.
--
-- Fencing (the `lock` strategy): with fence tokens, the read also raises each
-- segment's fence to the reader's token. A holder whose lease ran out and
-- who writes after a newer holder has read is then refused (write.lua), so
-- the newer holder's read can never be made stale behind its back.
--
-- KEYS[1] gen   KEYS[2] users   KEYS[3] idem   KEYS[4..3+m] segments to read
-- KEYS[4+m..3+2m] their fence keys (only when fenced)
-- ARGV[1] run_id   ARGV[2] user_id   ARGV[3] m   ARGV[4..3+m] fence tokens
-- Returns {gen, bought, idem record or '', units of each segment ...},
-- {-3} when there is no valid copy, {-4} when a newer holder has been here.
local g = redis.call('GET', KEYS[1])
if not g then return {-3} end
local gen, run_id = string.match(g, '^(%d+):(.*)$')
if run_id ~= ARGV[1] then return {-3} end
local m = tonumber(ARGV[3])
local fenced = #KEYS > 3 + m
if fenced then
    for j = 1, m do
        local hi = tonumber(redis.call('GET', KEYS[3 + m + j]) or '0')
        if tonumber(ARGV[3 + j]) < hi then return {-4} end
    end
end
local out = { tonumber(gen), tonumber(redis.call('HGET', KEYS[2], ARGV[2]) or '0'),
              redis.call('GET', KEYS[3]) or '' }
for j = 1, m do
    local v = redis.call('GET', KEYS[3 + j])
    if not v then return {-3} end
    out[#out + 1] = tonumber(v)
    if fenced then redis.call('SET', KEYS[3 + m + j], ARGV[3 + j]) end
end
return out
