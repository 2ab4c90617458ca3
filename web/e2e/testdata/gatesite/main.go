// Command gatesite is the target site of the room page's browser test
// (web/e2e/room-page.test.js): a "shop" that lets in only visitors with a
// valid access token of its waiting room. It prints "listening on <url>"
// once it serves. Not part of fanfare: a test fixture (testdata is outside
// ./... and the layering table).
package main

import (
	"flag"
	"fmt"
	"html"
	"log"
	"net"
	"net/http"
	"time"

	"github.com/fanfare-im/fanfare/fanout/waitroom/roomtoken"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "listen address")
	secret := flag.String("room-token-secret", "", "the HS256 secret fanfared signs access tokens with")
	room := flag.String("room", "sale", "the waiting room in front of /shop")
	flag.Parse()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /shop", func(w http.ResponseWriter, r *http.Request) {
		c, err := roomtoken.Verify(r.URL.Query().Get("fanfare_access"), []byte(*secret), *room, 5*time.Second)
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		if err != nil {
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprintf(w, "<!doctype html><link rel=icon href=\"data:,\"><title>no access</title><h1>No access</h1><p id=err>%s</p>", html.EscapeString(err.Error()))
			return
		}
		fmt.Fprintf(w, "<!doctype html><link rel=icon href=\"data:,\"><title>shop</title><h1>Welcome to the shop</h1><p>signed in as <b id=user>%s</b></p>", html.EscapeString(c.UID()))
	})
	fmt.Printf("listening on http://%s\n", ln.Addr())
	log.Fatal(http.Serve(ln, mux))
}
