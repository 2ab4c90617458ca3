package gateway

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/fanfare-im/fanfare/gateway/wire"
	"github.com/fanfare-im/fanfare/presence"
	"github.com/fanfare-im/fanfare/store"
	"github.com/fanfare-im/fanfare/store/embedded"
)

// stubView is an OnlineView whose answers the test sets.
type stubView struct {
	n     atomic.Int64
	stale atomic.Bool
	err   atomic.Pointer[error]
}

func (v *stubView) OnlineCount(ctx context.Context, gid int64) (int64, error) {
	if p := v.err.Load(); p != nil {
		return 0, *p
	}
	return v.n.Load(), nil
}

func (v *stubView) Stale() bool { return v.stale.Load() }

func TestOnlineRoute(t *testing.T) {
	st, err := embedded.Open(embedded.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if _, err := st.CreateGroup(t.Context(), store.Group{GID: 7, Name: "g", Owner: "o"}); err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, nil)
	view := &stubView{}
	here := map[int64]int{7: 2}
	if err := OnlineRoutes(f.api, OnlineConfig{View: view, Scope: OnlineScopeCluster, Here: func(gid int64) int { return here[gid] }, Store: st}); err != nil {
		t.Fatal(err)
	}
	f.start()
	unavailable := fmt.Errorf("%w: dial tcp: connection refused", presence.ErrUnavailable)
	cases := []struct {
		name   string
		path   string
		bearer string
		n      int64
		stale  bool
		err    error
		status int
		body   string // exact, for 200
		code   string // for errors
	}{
		{"count", "/admin/v1/groups/7/online", adminToken, 5, false, nil, 200, `{"gid":7,"online":5,"online_here":2,"stale":false,"scope":"cluster"}`, ""},
		{"stale", "/admin/v1/groups/7/online", adminToken, 3, true, nil, 200, `{"gid":7,"online":3,"online_here":2,"stale":true,"scope":"cluster"}`, ""},
		{"view unavailable", "/admin/v1/groups/7/online", adminToken, 0, true, unavailable, 503, "", wire.CodeUnavailable},
		{"view fails otherwise", "/admin/v1/groups/7/online", adminToken, 0, false, errors.New("redispresence: ERR weird"), 500, "", wire.CodeInternal},
		{"unknown group", "/admin/v1/groups/8/online", adminToken, 0, false, nil, 404, "", wire.CodeNotFound},
		{"bad gid", "/admin/v1/groups/seven/online", adminToken, 0, false, nil, 400, "", wire.CodeBadRequest},
		{"user token", "/admin/v1/groups/7/online", f.token(t, "u", 0), 0, false, nil, 401, "", wire.CodeUnauthorized},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			view.n.Store(tc.n)
			view.stale.Store(tc.stale)
			view.err.Store(nil)
			if tc.err != nil {
				view.err.Store(&tc.err)
			}
			r := f.do(t, "GET", tc.path, tc.bearer, "")
			if r.status != tc.status {
				t.Fatalf("status: got %d (%s), want %d", r.status, r.body, tc.status)
			}
			if tc.status == 200 && strings.TrimSpace(r.body) != tc.body {
				t.Fatalf("body: got %s, want %s", r.body, tc.body)
			}
			if tc.status != 200 && r.err.Code != tc.code {
				t.Fatalf("code: got %q, want %q", r.err.Code, tc.code)
			}
		})
	}
}

func TestOnlineRoutesConfig(t *testing.T) {
	st, err := embedded.Open(embedded.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	here := func(int64) int { return 0 }
	for _, tc := range []struct {
		name string
		cfg  OnlineConfig
	}{
		{"no view", OnlineConfig{Scope: OnlineScopeNode, Here: here, Store: st}},
		{"no here", OnlineConfig{View: &stubView{}, Scope: OnlineScopeNode, Store: st}},
		{"no store", OnlineConfig{View: &stubView{}, Scope: OnlineScopeNode, Here: here}},
		{"bad scope", OnlineConfig{View: &stubView{}, Scope: "world", Here: here, Store: st}},
	} {
		if err := OnlineRoutes(newFixture(t, nil).api, tc.cfg); err == nil {
			t.Errorf("%s: got nil error", tc.name)
		}
	}
}

func TestClusterPresenceCollector(t *testing.T) {
	var stale atomic.Bool
	stats := ClusterPresenceStats{Flushes: 9, Failures: 2, FullWrites: 3, DeltaWrites: 4, Renewals: 5, Deletes: 6, Resyncs: 7, BytesWritten: 800}
	reg := prometheus.NewRegistry()
	reg.MustRegister(ClusterPresenceCollector(func() ClusterPresenceStats { return stats }, stale.Load))
	want := map[string]float64{
		`fanfare_presence_cluster_flushes_total{result="ok"}`:     9,
		`fanfare_presence_cluster_flushes_total{result="failed"}`: 2,
		`fanfare_presence_cluster_writes_total{kind="full"}`:      3,
		`fanfare_presence_cluster_writes_total{kind="delta"}`:     4,
		`fanfare_presence_cluster_writes_total{kind="renewal"}`:   5,
		`fanfare_presence_cluster_writes_total{kind="delete"}`:    6,
		`fanfare_presence_cluster_resyncs_total`:                  7,
		`fanfare_presence_cluster_written_bytes_total`:            800,
		`fanfare_presence_cluster_stale`:                          0,
	}
	for _, s := range []bool{false, true} {
		stale.Store(s)
		if s {
			want[`fanfare_presence_cluster_stale`] = 1
		}
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]float64{}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				name := mf.GetName()
				for _, l := range m.GetLabel() {
					name += fmt.Sprintf("{%s=%q}", l.GetName(), l.GetValue())
				}
				v := m.GetCounter().GetValue()
				if mf.GetType() == dto.MetricType_GAUGE {
					v = m.GetGauge().GetValue()
				}
				got[name] = v
			}
		}
		if !maps.Equal(got, want) {
			t.Errorf("stale=%v: got %v, want %v", s, got, want)
		}
	}
}
