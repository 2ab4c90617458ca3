package redislimit

import "strings"

// portSingle is the port of this package's single throwaway redis-server
// (failover, NOSCRIPT, benchmarks; tests and benchmarks here run one at a
// time). TestSuiteRedisCluster's cluster takes 16411-16413, bus ports
// 16414-16416; internal/redistest lists every package's range.
const portSingle = 16410

// slot is Redis Cluster's key slot: CRC16/XMODEM of the hash tag (or key)
// modulo 16384.
func slot(key string) uint16 {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for k := 0; k < len(key); k++ {
		crc ^= uint16(key[k]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc % 16384
}
