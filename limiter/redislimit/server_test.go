package redislimit

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Ports for throwaway redis-server instances, reserved for this package's
// tests and benchmarks (which run one at a time): 56379 for single servers
// (failover, NOSCRIPT, benchmarks), 56380-56382 for a cluster whose bus
// ports are 56383-56385. They lie in the kernel's ephemeral range, where
// other processes' client sockets on 127.0.0.1 may hold them at any time,
// so the servers bind a loopback address of their own.
const (
	testHost = "127.86.6.1"

	portSingle  = 56379
	portCluster = 56380
	busOffset   = 3
)

// redisProc is a redis-server started by a test and stopped by it; the
// shared Redis is never touched.
type redisProc struct {
	t    testing.TB
	port int
	dir  string
	args []string
	cmd  *exec.Cmd
}

func startRedis(t testing.TB, port int, args ...string) *redisProc {
	t.Helper()
	p := &redisProc{t: t, port: port, dir: t.TempDir(), args: args}
	p.start()
	t.Cleanup(p.stop)
	return p
}

func (p *redisProc) addr() string { return testHost + ":" + strconv.Itoa(p.port) }

func (p *redisProc) start() {
	p.t.Helper()
	if c, err := net.DialTimeout("tcp", p.addr(), 100*time.Millisecond); err == nil {
		c.Close()
		p.t.Fatalf("%s is in use: a leftover redis-server? (ports 56379-56385 belong to limiter tests)", p.addr())
	}
	args := append([]string{"--port", strconv.Itoa(p.port), "--bind", testHost, "--save", "", "--appendonly", "no", "--dir", p.dir}, p.args...)
	p.cmd = exec.Command("redis-server", args...)
	if err := p.cmd.Start(); err != nil {
		p.t.Fatalf("start redis-server (apt-get install redis-server): %v", err)
	}
	c := redis.NewClient(&redis.Options{Addr: p.addr(), DialTimeout: 100 * time.Millisecond})
	defer c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for c.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			p.stop()
			p.t.Fatalf("redis-server on %d did not answer within 5s", p.port)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// stop kills the server (as a crash would) and waits for it.
func (p *redisProc) stop() {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	p.cmd.Process.Kill()
	p.cmd.Wait()
	p.cmd = nil
}

// startCluster starts three masters with no replicas and joins them.
func startCluster(t testing.TB, firstPort int) []string {
	t.Helper()
	var addrs []string
	for i := range 3 {
		port := firstPort + i
		p := startRedis(t, port, "--cluster-enabled", "yes", "--cluster-port", strconv.Itoa(port+busOffset),
			"--cluster-announce-ip", testHost, "--cluster-announce-port", strconv.Itoa(port),
			"--cluster-announce-bus-port", strconv.Itoa(port+busOffset),
			"--cluster-config-file", fmt.Sprintf("nodes-%d.conf", port), "--cluster-node-timeout", "2000")
		addrs = append(addrs, p.addr())
	}
	// Join by hand: redis-cli --cluster create does not know bus ports
	// other than port+10000.
	ctx := context.Background()
	c0 := redis.NewClient(&redis.Options{Addr: addrs[0]})
	defer c0.Close()
	for i := 1; i < len(addrs); i++ {
		port := firstPort + i
		if err := c0.Do(ctx, "CLUSTER", "MEET", testHost, port, port+busOffset).Err(); err != nil {
			t.Fatalf("CLUSTER MEET: %v", err)
		}
	}
	for i, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		lo, hi := i*16384/3, (i+1)*16384/3-1
		if err := c.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			t.Fatalf("CLUSTER ADDSLOTSRANGE %d %d: %v", lo, hi, err)
		}
		c.Close()
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		for {
			info, err := c.ClusterInfo(context.Background()).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				c.Close()
				t.Fatalf("cluster not ok within 10s: %v %s", err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		c.Close()
	}
	return addrs
}

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
