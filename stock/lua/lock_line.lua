-- lock_line.lua: `fair-lock`'s places in line for orders that wait on
-- this instance behind others (lock/lock.h, FAIRNESS): an instance's orders
-- join the line at the end of the loop turn they came in, in their order,
-- so that they are ahead of the orders that came after them, on any
-- instance; the instance keeps its waiting orders' places alive (each
-- place lapses ARGV[2] ms after its last call, so a dead instance's places
-- go by themselves); an order that gives up leaves.
-- KEYS[1] lock   KEYS[2..4] the line: queue, due, sub
-- ARGV[1] 'join', 'keep' or 'leave'   ARGV[2] a place's lease ms
-- ARGV[3] the line's keys' ttl ms   ARGV[4] the wake channel prefix
-- ARGV[5..] owner ids, in arrival order (leave: one; join: none in line yet)
-- Returns how many (join, keep: kept), or 1 (leave).
if redis.replicate_commands then redis.replicate_commands() end
local queue, due, sub = KEYS[2], KEYS[3], KEYS[4]
if ARGV[1] == 'leave' then
    lock_fair_leave(KEYS[1], queue, due, sub, ARGV[5], ARGV[4])
    return 1
end
local now = lock_now_ms()
local ws = {}
for i = 5, #ARGV do ws[#ws + 1] = ARGV[i] end
if ARGV[1] == 'join' then
    lock_fair_join_all(queue, due, ws, tonumber(ARGV[2]), now, tonumber(ARGV[3]))
    return #ws
end
local da = {}
for _, w in ipairs(ws) do
    da[#da + 1] = now + tonumber(ARGV[2])
    da[#da + 1] = w
end
local kept = #da > 0 and redis.call('zadd', due, 'XX', 'CH', unpack(da)) or 0
for _, k in ipairs({queue, due, sub}) do
    if redis.call('pttl', k) < tonumber(ARGV[3]) then redis.call('pexpire', k, ARGV[3]) end
end
return kept
