// Command gatesite is the target site of the room page's browser test
// (web/e2e/room-page.test.js): a "shop" behind package gate, which lets in
// only visitors with a valid access token of its waiting room and sends
// everybody else to the room's hosted page. It prints "listening on <url>"
// once it serves. A test fixture, not part of fanfare (testdata is outside
// ./... and the layering table).
package main

import (
	"flag"
	"fmt"
	"html"
	"log"
	"net"
	"net/http"

	"github.com/fanfare-im/fanfare/gate"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "listen address")
	secret := flag.String("room-token-secret", "", "the HS256 secret fanfared signs access tokens with")
	room := flag.String("room", "sale", "the waiting room in front of /shop")
	queue := flag.String("queue-url", "", "the room's hosted page")
	flag.Parse()
	g, err := gate.New(gate.Config{Room: *room, QueueURL: *queue, Secret: []byte(*secret)})
	if err != nil {
		log.Fatal(err)
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /shop", g.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _ := gate.ClaimsFrom(r.Context())
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, `<!doctype html><link rel=icon href="data:,"><title>shop</title><h1>Welcome to the shop</h1><p>signed in as <b id=user>%s</b></p>`, html.EscapeString(c.UID()))
	})))
	fmt.Printf("listening on http://%s\n", ln.Addr())
	log.Fatal(http.Serve(ln, mux))
}
