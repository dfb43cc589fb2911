-- lock_line.lua: `fair-lock`'s places in line for orders that wait on
-- this instance behind others (lock/lock.h, FAIRNESS): an order joins the
-- line when it arrives, so that it is ahead of the orders that came after
-- it, on any instance; the instance keeps its waiting orders' places alive
-- (each place lapses ARGV[2] ms after its last call, so a dead instance's
-- places go by themselves); an order that gives up leaves.
-- KEYS[1] lock   KEYS[2..4] the line: queue, due, sub
-- ARGV[1] 'join', 'keep' or 'leave'   ARGV[2] a place's lease ms
-- ARGV[3] the line's keys' ttl ms   ARGV[4] the wake channel prefix
-- ARGV[5..] owner ids (join, leave: one)
-- Returns the rank joined at (join), or how many places were kept (keep), or
-- 1 (leave).
if redis.replicate_commands then redis.replicate_commands() end
local queue, due, sub = KEYS[2], KEYS[3], KEYS[4]
if ARGV[1] == 'leave' then
    lock_fair_leave(KEYS[1], queue, due, sub, ARGV[5], ARGV[4])
    return 1
end
local now = lock_now_ms()
if ARGV[1] == 'keep' then
    local kept = 0
    for i = 5, #ARGV do
        kept = kept + redis.call('zadd', due, 'XX', 'CH', now + tonumber(ARGV[2]), ARGV[i])
    end
    for _, k in ipairs({queue, due, sub}) do
        if redis.call('pttl', k) < tonumber(ARGV[3]) then redis.call('pexpire', k, ARGV[3]) end
    end
    return kept
end
local _, rank = lock_fair_stay(queue, due, sub, ARGV[5], false, tonumber(ARGV[2]), now,
                               tonumber(ARGV[3]))
return rank
