-- read.lua: the read half of the read-check-write strategies (lock, local,
-- unsafe-*). It only reads, so the check that follows in C can be raced by
-- other writers: that is the point of those strategies, and what a lock
-- around read, check and write must prevent.
--
-- Fencing (the lock strategies): with fence tokens, the read also admits
-- the reader at each segment's fence (format.lua's lock_fence_admit: its
-- token of the newest incarnation raises the fence; a new incarnation
-- becomes the newest), which blocks every earlier holder. A holder whose
-- lease ran out and who writes after a newer holder has read is then
-- refused (write.lua), so the newer holder's read can never be made stale
-- behind its back. Runs after format.lua (lock_script_compose).
--
-- KEYS[1] gen   KEYS[2] users   KEYS[3] idem   KEYS[4..3+m] segments to read
-- KEYS[4+m..3+2m] their fence keys (only when fenced)
-- ARGV[1] run_id   ARGV[2] user_id   ARGV[3] m
-- ARGV[4..3+2m] (only when fenced) per segment: fence token, incarnation
-- (16 hex digits)
-- Returns {gen, bought, idem record or '', units of each segment ...,
-- then (fenced) the epoch each fence admitted the reader at}, {-3} when
-- there is no valid copy, {-4} when a newer holder has been here.
local g = redis.call('GET', KEYS[1])
if not g then return {-3} end
local gen, run_id = string.match(g, '^(%d+):(.*)$')
if run_id ~= ARGV[1] then return {-3} end
local m = tonumber(ARGV[3])
local fenced = #KEYS > 3 + m
local out = { tonumber(gen), tonumber(redis.call('HGET', KEYS[2], ARGV[2]) or '0'),
              redis.call('GET', KEYS[3]) or '' }
for j = 1, m do
    local v = redis.call('GET', KEYS[3 + j])
    if not v then return {-3} end
    out[#out + 1] = tonumber(v)
end
-- Admitted at every fence or at none: every refusal is found before any
-- fence moves.
if fenced then
    for j = 1, m do
        if not lock_fence_admit(KEYS[3 + m + j], ARGV[3 + 2 * j], ARGV[2 + 2 * j], true) then
            return {-4}
        end
    end
    for j = 1, m do
        out[#out + 1] = lock_fence_admit(KEYS[3 + m + j], ARGV[3 + 2 * j], ARGV[2 + 2 * j])
    end
end
return out
