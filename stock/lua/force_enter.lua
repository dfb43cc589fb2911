-- force_enter.lua: fault injection only (a product's cs_overlap). A holder
-- enters the critical section of one segment with the units it read, and
-- learns how many holders with that same read are inside with it now.
-- The forcing (rcw.c, "forcing an interleaving") then waits until enough
-- holders have been inside with it -- those here at its arrival and those
-- arriving after it -- or until its bound. Keys expire on their own: a
-- holder that dies inside leaves nothing for long.
-- KEYS[1] the holders inside (a set)   KEYS[2] arrivals so far (a counter)
-- ARGV[1] this holder's id   ARGV[2] time to live of both keys, ms
-- Returns { holders inside now, this one included; this one's arrival number }.
redis.call('SADD', KEYS[1], ARGV[1])
local inside = redis.call('SCARD', KEYS[1])
local arrival = redis.call('INCR', KEYS[2])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return { inside, arrival }
