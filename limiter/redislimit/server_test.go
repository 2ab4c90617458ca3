package redislimit

import "strings"

// portSingle is the port of this package's single throwaway redis-server
// (failover, NOSCRIPT, benchmarks; tests and benchmarks here run one at a
// time). TestSuiteRedisCluster's cluster takes 16411-16413, bus ports
// 16414-16416; internal/redistest lists every package's range.
const portSingle = 16410

// slot is Redis Cluster's key slot: that of the hash tag, or of the whole
// key when it has none.
func slot(key string) uint16 {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return tagSlot(key)
}
