// Package redistest gives tests a redis-server of their own (Start) or a
// Redis Cluster of their own (StartCluster), for failure tests that stop,
// pause or flush Redis and for cluster tests; the shared test Redis
// (FANFARE_TEST_REDIS_ADDR) is never touched by them, and Addr names it for
// the tests that use it. It imports only the standard library and
// go-redis, so any package's tests may use it.
//
// It sits in a top-level internal/ (an exception to the layout of CONTRIBUTING.md §1)
// because its users are Redis backends of three layers that must not import
// each other (limiter/redislimit, presence/redispresence, fanout's bus and
// waiting room); pgtest can live under store/postgres since only Postgres
// tests use it. Only tests import it.
//
// A server listens on 127.0.0.1 at a fixed port chosen by the test. Ports
// must lie below the kernel's ephemeral range (32768-60999), where the
// client sockets of tests running in parallel can hold a port at any time;
// Start refuses the others. Packages' tests run in parallel with each
// other, so each package owns a range of its own, and tests within a
// package take distinct ports or run one after another. The allocation of
// throwaway servers' ports, Postgres ones (store/postgres/pgtest) included:
//
//	16380-16389  internal/redistest         16380-16382 its own tests
//	16390-16399  fanout/waitroom/redisroom  16390-16391 single servers
//	16400-16409  presence/redispresence     16400-16403 single servers
//	16410-16419  limiter/redislimit         16410 single; 16411-16413 cluster, bus 16414-16416
//	16420-16429  fanout/bus/redisbus        16420 single; 16421-16423 cluster, bus 16424-16426
//	16430-16439  fanout/redishot            16430 single; 16431-16433 cluster, bus 16434-16436
//	16440-16449  fanout/redisquota          16440 single
//	16450-16459  fanout                     16450-16453 single servers
//	16460-16469  cmd/fanfared               16460-16461 single
//	25432-25439  store/postgres             pgtest.StartThrowaway
//	25440-25447  cmd/fanfared               pgtest.StartThrowaway from 25440 up; 25447 redistest (adversarial_test.go)
//	16490, 25490 make soak (.ci/soak)       its Redis and Postgres (.ci/services in a directory of its own)
//
// A new package's tests take the next free range of ten and add it here.
//
// A Server belongs to the test that started it: Start, Pause and Resume
// call that test's Fatal, so they run on its goroutine. t.Cleanup kills the
// server and removes its directory.
package redistest
