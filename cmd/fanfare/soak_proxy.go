package main

import (
	"io"
	mrand "math/rand/v2"
	"net"
	"sync"
)

// cutProxy is a TCP relay in front of a node's socket port that can cut
// a connection at random: the client sees its socket reset, as on a
// network fault, and the SDK's own redial, sync and catch-up run (a Conn
// closed and dialed again by the app does not exercise them). Two copy
// goroutines per connection; the soak routes a quarter of its users
// through it.
type cutProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  map[*proxyPair]struct{}
	wg     sync.WaitGroup
}

type proxyPair struct{ client, server net.Conn }

func startProxy(target string) (*cutProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &cutProxy{ln: ln, target: target, conns: map[*proxyPair]struct{}{}}
	p.wg.Go(p.serve)
	return p, nil
}

// addr is the proxy's host:port.
func (p *cutProxy) addr() string { return p.ln.Addr().String() }

func (p *cutProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Go(func() { p.relay(c) })
	}
}

func (p *cutProxy) relay(c net.Conn) {
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	pair := &proxyPair{client: c, server: s}
	p.mu.Lock()
	p.conns[pair] = struct{}{}
	p.mu.Unlock()
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(s, c)
		s.Close()
		close(done)
	}()
	_, _ = io.Copy(c, s)
	c.Close()
	<-done
	p.mu.Lock()
	delete(p.conns, pair)
	p.mu.Unlock()
}

// cutOne resets a random connection (both sides, linger 0: an RST, not
// a clean close); false when there is none.
func (p *cutProxy) cutOne() bool {
	p.mu.Lock()
	var pick *proxyPair
	if n := len(p.conns); n > 0 {
		k := mrand.N(n)
		for pair := range p.conns {
			if k == 0 {
				pick = pair
				break
			}
			k--
		}
	}
	p.mu.Unlock()
	if pick == nil {
		return false
	}
	for _, c := range []net.Conn{pick.client, pick.server} {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		c.Close()
	}
	return true
}

// close stops accepting, cuts every connection and waits for the relays.
func (p *cutProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for pair := range p.conns {
		pair.client.Close()
		pair.server.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
