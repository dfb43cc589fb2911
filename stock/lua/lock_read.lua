-- lock_read.lua: the `lock` strategy's first round trip on an event loop:
-- take the segment's lock and read what the check needs, in one atomic
-- step. The lock is the lock module's own (lock/lock.h, THE FORMAT), taken
-- by its functions (lock/lua/format.lua: lock_free, lock_take), which this
-- body follows in one script (lock_script_compose): so a holder on the
-- blocking path (or another instance) and this one exclude each other, and
-- the format is written in the lock module only. Reading under the lock
-- also raises the segment's fence to the token (as read.lua does), so a
-- holder whose lease ran out cannot write over this one's work.
--
-- `fair-lock` (ARGV[5] > 0) takes the lock only as the head of its line
-- (lock/lock.h, FAIRNESS: the fair lock's format, format.lua's lock_fair_*):
-- otherwise the order keeps (or takes) its place, as a waiter that polls
-- (it does not listen on a wake channel), and its place lasts ARGV[5] ms.
--
-- KEYS[1] lock   KEYS[2] the lock's token counter   KEYS[3] gen   KEYS[4] users
-- KEYS[5] idem record   KEYS[6] the segment's stock   KEYS[7] the segment's fence
-- KEYS[8..10] the fair line: queue, due, sub (`fair-lock` only)
-- ARGV[1] owner id (32 hex)   ARGV[2] lease ms   ARGV[3] run_id   ARGV[4] user_id
-- ARGV[5] fair: a place's lease ms (absent: `lock`, not fair)   ARGV[6] fair: the line's
-- keys' ttl ms   ARGV[7] fair: the wake channel prefix   ARGV[8..] fair: owner ids
-- of the orders that came behind this one on its instance since the last call,
-- joined at the back after it (lock_line.lua's join, carried by this call)
-- Returns {1, token, gen, bought, idem record or '', units} when taken,
-- {0, pttl[, rank]} when held by another (fair: or another is first in line),
-- {-3} (not taken; fair: out of line) when there is no valid stock copy.
local fair = ARGV[5] ~= nil
local head, now
-- Redis's clock, read once a call (the line's dues and tickets).
local function clock()
    if not now then now = lock_now_ms() end
    return now
end
-- After this order's own take or place: the orders behind it, into the line.
local function behind()
    if not fair or #ARGV < 8 then return end
    local ws = {}
    for i = 8, #ARGV do ws[#ws + 1] = ARGV[i] end
    lock_fair_join_all(KEYS[8], KEYS[9], ws, tonumber(ARGV[5]), clock(), tonumber(ARGV[6]))
end
if fair then
    if redis.replicate_commands then redis.replicate_commands() end
    local free, pruned = lock_free(KEYS[1]), 0
    head = lock_fair_head(KEYS[8])
    -- An empty line: nothing to look at; this order at its head: no one is
    -- ahead of it to drop (those behind lapse at the release's prune).
    if head and head ~= ARGV[1] then
        pruned = lock_fair_prune(KEYS[8], KEYS[9], KEYS[10], clock())
        if pruned > 0 then head = lock_fair_head(KEYS[8]) end
    end
    if not free or (head and head ~= ARGV[1]) then
        if free and pruned > 0 then lock_fair_wake(KEYS[8], KEYS[9], KEYS[10], ARGV[7]) end
        local _, rank = lock_fair_stay(KEYS[8], KEYS[9], KEYS[10], ARGV[1], false,
                                       tonumber(ARGV[5]), clock(), tonumber(ARGV[6]))
        behind()
        return {0, redis.call('PTTL', KEYS[1]), rank}
    end
elseif not lock_free(KEYS[1]) then
    return {0, redis.call('PTTL', KEYS[1])}
end
local g = redis.call('GET', KEYS[3])
local gen, run_id
if g then gen, run_id = string.match(g, '^(%d+):(.*)$') end
local v = redis.call('GET', KEYS[6])
if not g or run_id ~= ARGV[3] or not v then
    if fair then lock_fair_leave(KEYS[1], KEYS[8], KEYS[9], KEYS[10], ARGV[1], ARGV[7]) end
    behind()
    return {-3}                  -- not taken: no lock to release
end
local token = lock_take(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
-- In line only as its head (an empty line: never joined): out of it now.
-- Its place only: an order of the service polls, it is never marked as
-- listening (sub), so there is nothing of it to take out there.
if head then lock_fair_drop(KEYS[8], KEYS[9], nil, ARGV[1]) end
behind()
if tonumber(redis.call('GET', KEYS[7]) or '0') < token then
    redis.call('SET', KEYS[7], token)
end
return {1, token, tonumber(gen), tonumber(redis.call('HGET', KEYS[4], ARGV[4]) or '0'),
        redis.call('GET', KEYS[5]) or '', tonumber(v)}
