-- Nexmark q3, local item suggestion: who sells in category 10 in a few states.
-- Published (Flink):
--   SELECT P.name, P.city, P.state, A.id
--   FROM auction AS A INNER JOIN person AS P ON A.seller = P.id
--   WHERE A.category = 10 AND (P.state = 'or' OR P.state = 'id' OR P.state = 'ca')
-- ubik: a regular join's state grows forever, so person is read as a
-- versioned table (FOR SYSTEM_TIME AS OF the auction's time): each auction
-- meets its seller as registered at the auction's time. State is one row
-- per person (the table), none per auction. One difference in the result:
-- the generator names as seller, for about 1 auction in 100, a person it
-- registers up to a second after the auction; the regular join pairs
-- those, the temporal join does not (the seller did not exist yet). The
-- oracle is the regular join with that condition added. The generator (the
-- `nexmark` crate, RisingWave's) writes states in lower case, so the states
-- are 'or', 'id', 'ca', as in RisingWave's q3.
-- oracle: SELECT P.name, P.city, P.state, A.id FROM auction A JOIN person P ON A.seller = P.id AND P.date_time <= A.date_time
-- oracle: WHERE A.category = 10 AND (P.state = 'or' OR P.state = 'id' OR P.state = 'ca')
SELECT P.name, P.city, P.state, A.id
FROM auction AS A
JOIN person FOR SYSTEM_TIME AS OF A.date_time AS P ON A.seller = P.id
WHERE A.category = 10 AND (P.state = 'or' OR P.state = 'id' OR P.state = 'ca')
