package fanout

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ErrInvalidTuning wraps every problem Tuning.Validate reports.
var ErrInvalidTuning = errors.New("fanout: invalid tuning")

// maxMergeWindow bounds the merge window: hot groups and groups at L1/L2
// get their pushes once per window, and tier 2 writes once per window; a
// longer wait is worse than a pull.
const maxMergeWindow = 10 * time.Second

// Tuning is the part of Config that may change while the engine runs
// (docs/architecture.md §13: limits, tiers and thresholds reload without restart):
// merge windows, the Little's Law target, group limits, trigger thresholds
// and hysteresis, hot-group detection and tier 2. Engine.SetTuning swaps it
// atomically; workers read it once per batch or tick, so a change applies
// from the next batch, and connections, queues and group state are kept.
//
// Units and "zero means" are those of the Config field of the same name:
// zero is the default (a derived one, e.g. GroupBuffer = 2 x GroupRate, is
// derived from the other fields of the same Tuning), negative disables
// where Config says so. Engine.Tuning returns the values in force, with
// the defaults filled in.
//
// Not in Tuning, because they cannot change under a running engine:
// Shards and HotShards (worker goroutines, and the gid -> worker hash that
// orders a group's sends), QueueCap and HotQueueCap (channel capacities),
// RateWindow (the bucket width of every group's rate rings: a new width
// would misindex their buckets), EvalInterval and NodeInterval (the
// cadence of the sweeps and the controller's ticker), and the commit path
// (MaxBatch, Linger, CommitTimeout), Store, Presence, Pusher, Levels, Now,
// Metrics, Logger.
//
// Its JSON form (the admin API's document) uses the snake_case names in
// the tags, durations as Go duration strings ("200ms"); decoding requires
// every field and refuses unknown ones.
type Tuning struct {
	MergeWindow time.Duration `json:"merge_window"` // Config.MergeWindow; at most 10 s
	MaxMerge    int           `json:"max_merge"`    // Config.MaxMerge

	QueueTargetWait time.Duration `json:"queue_target_wait"` // Config.TargetWait
	QueueSafety     float64       `json:"queue_safety"`      // Config.Safety, in (0, 1]
	QueueMinBound   int           `json:"queue_min_bound"`   // Config.MinQueue

	LargeGroup       int     `json:"large_group_members"` // Config.LargeGroup
	GroupRate        float64 `json:"group_rate"`          // Config.GroupRate
	GroupBuffer      int     `json:"group_buffer"`        // Config.GroupBuffer
	DownlinkRate     float64 `json:"downlink_rate"`       // Config.DownlinkRate
	DownlinkFraction float64 `json:"downlink_fraction"`   // Config.DownlinkFraction
	AtAllPerDay      int     `json:"at_all_per_day"`      // Config.AtAllPerDay

	ClearFraction float64       `json:"trigger_clear_fraction"` // Config.ClearFraction
	ClearAfter    time.Duration `json:"trigger_clear_after"`    // Config.ClearAfter

	HotFactor        float64       `json:"hot_factor"`         // Config.HotFactor
	HotMinRate       float64       `json:"hot_min_rate"`       // Config.HotMinRate
	HotBaselineFloor float64       `json:"hot_baseline_floor"` // Config.HotBaselineFloor
	BaselineTau      time.Duration `json:"hot_baseline_tau"`   // Config.BaselineTau
	HotClearAfter    time.Duration `json:"hot_clear_after"`    // Config.HotClearAfter
	HotGroupRate     float64       `json:"hot_group_rate"`     // Config.HotGroupRate
	HotGroupBuffer   int           `json:"hot_group_buffer"`   // Config.HotGroupBuffer

	EgressBandwidth   int64         `json:"egress_bandwidth"`    // Config.EgressBandwidth
	EgressFraction    float64       `json:"egress_fraction"`     // Config.EgressFraction
	StoreLatencyAlarm time.Duration `json:"store_latency_alarm"` // Config.StoreLatencyAlarm
	StoreClearProbes  int           `json:"store_clear_probes"`  // Config.StoreClearProbes

	Tier2Off            bool          `json:"tier2_off"`              // Config.Tier2Off
	Tier2MinActiveShare float64       `json:"tier2_min_active_share"` // Config.Tier2MinActiveShare
	Tier2MaxMembers     int           `json:"tier2_max_members"`      // Config.Tier2MaxMembers
	ActiveWindow        time.Duration `json:"active_window"`          // Config.ActiveWindow
	ActiveRefresh       time.Duration `json:"active_refresh"`         // Config.ActiveRefresh
}

// Tuning returns the tunable fields of c, as set (zero = default).
func (c *Config) Tuning() Tuning {
	return Tuning{
		MergeWindow:         c.MergeWindow,
		MaxMerge:            c.MaxMerge,
		QueueTargetWait:     c.TargetWait,
		QueueSafety:         c.Safety,
		QueueMinBound:       c.MinQueue,
		LargeGroup:          c.LargeGroup,
		GroupRate:           c.GroupRate,
		GroupBuffer:         c.GroupBuffer,
		DownlinkRate:        c.DownlinkRate,
		DownlinkFraction:    c.DownlinkFraction,
		AtAllPerDay:         c.AtAllPerDay,
		ClearFraction:       c.ClearFraction,
		ClearAfter:          c.ClearAfter,
		HotFactor:           c.HotFactor,
		HotMinRate:          c.HotMinRate,
		HotBaselineFloor:    c.HotBaselineFloor,
		BaselineTau:         c.BaselineTau,
		HotClearAfter:       c.HotClearAfter,
		HotGroupRate:        c.HotGroupRate,
		HotGroupBuffer:      c.HotGroupBuffer,
		EgressBandwidth:     c.EgressBandwidth,
		EgressFraction:      c.EgressFraction,
		StoreLatencyAlarm:   c.StoreLatencyAlarm,
		StoreClearProbes:    c.StoreClearProbes,
		Tier2Off:            c.Tier2Off,
		Tier2MinActiveShare: c.Tier2MinActiveShare,
		Tier2MaxMembers:     c.Tier2MaxMembers,
		ActiveWindow:        c.ActiveWindow,
		ActiveRefresh:       c.ActiveRefresh,
	}
}

// SetTuning sets the tunable fields of c from t.
func (c *Config) SetTuning(t Tuning) {
	c.MergeWindow = t.MergeWindow
	c.MaxMerge = t.MaxMerge
	c.TargetWait = t.QueueTargetWait
	c.Safety = t.QueueSafety
	c.MinQueue = t.QueueMinBound
	c.LargeGroup = t.LargeGroup
	c.GroupRate = t.GroupRate
	c.GroupBuffer = t.GroupBuffer
	c.DownlinkRate = t.DownlinkRate
	c.DownlinkFraction = t.DownlinkFraction
	c.AtAllPerDay = t.AtAllPerDay
	c.ClearFraction = t.ClearFraction
	c.ClearAfter = t.ClearAfter
	c.HotFactor = t.HotFactor
	c.HotMinRate = t.HotMinRate
	c.HotBaselineFloor = t.HotBaselineFloor
	c.BaselineTau = t.BaselineTau
	c.HotClearAfter = t.HotClearAfter
	c.HotGroupRate = t.HotGroupRate
	c.HotGroupBuffer = t.HotGroupBuffer
	c.EgressBandwidth = t.EgressBandwidth
	c.EgressFraction = t.EgressFraction
	c.StoreLatencyAlarm = t.StoreLatencyAlarm
	c.StoreClearProbes = t.StoreClearProbes
	c.Tier2Off = t.Tier2Off
	c.Tier2MinActiveShare = t.Tier2MinActiveShare
	c.Tier2MaxMembers = t.Tier2MaxMembers
	c.ActiveWindow = t.ActiveWindow
	c.ActiveRefresh = t.ActiveRefresh
}

// Validate reports every problem of t, as set (zero = default), wrapped in
// ErrInvalidTuning. Names are those of the JSON form.
func (t Tuning) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	for name, v := range map[string]time.Duration{
		"queue_target_wait": t.QueueTargetWait, "trigger_clear_after": t.ClearAfter,
		"hot_baseline_tau": t.BaselineTau, "hot_clear_after": t.HotClearAfter,
		"active_window": t.ActiveWindow, "active_refresh": t.ActiveRefresh,
	} {
		if v < 0 {
			bad("%s must not be negative, got %v", name, v)
		}
	}
	if t.MergeWindow < 0 || t.MergeWindow > maxMergeWindow {
		bad("merge_window must be in 0..%v (0 = 200ms), got %v", maxMergeWindow, t.MergeWindow)
	}
	for name, v := range map[string]int64{
		"max_merge": int64(t.MaxMerge), "queue_min_bound": int64(t.QueueMinBound),
		"large_group_members": int64(t.LargeGroup), "group_buffer": int64(t.GroupBuffer),
		"hot_group_buffer": int64(t.HotGroupBuffer), "egress_bandwidth": t.EgressBandwidth,
		"store_clear_probes": int64(t.StoreClearProbes), "tier2_max_members": int64(t.Tier2MaxMembers),
	} {
		if v < 0 {
			bad("%s must not be negative, got %d", name, v)
		}
	}
	for name, v := range map[string]float64{
		"queue_safety": t.QueueSafety, "group_rate": t.GroupRate, "downlink_rate": t.DownlinkRate,
		"downlink_fraction": t.DownlinkFraction, "trigger_clear_fraction": t.ClearFraction,
		"hot_factor": t.HotFactor, "hot_min_rate": t.HotMinRate, "hot_baseline_floor": t.HotBaselineFloor,
		"hot_group_rate": t.HotGroupRate, "egress_fraction": t.EgressFraction,
		"tier2_min_active_share": t.Tier2MinActiveShare,
	} {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			bad("%s must be a finite number, got %v", name, v)
		}
	}
	for name, v := range map[string]float64{
		"queue_safety": t.QueueSafety, "downlink_fraction": t.DownlinkFraction, "egress_fraction": t.EgressFraction,
	} {
		if v < 0 || v > 1 {
			bad("%s must be in (0, 1] (0 = default), got %v", name, v)
		}
	}
	if t.ClearFraction < 0 || t.ClearFraction >= 1 {
		bad("trigger_clear_fraction must be in (0, 1) (0 = 0.5), got %v", t.ClearFraction)
	}
	if t.Tier2MinActiveShare > 1 {
		bad("tier2_min_active_share must be at most 1 (negative = no threshold), got %v", t.Tier2MinActiveShare)
	}
	for name, v := range map[string]float64{
		"hot_min_rate": t.HotMinRate, "hot_baseline_floor": t.HotBaselineFloor, "hot_group_rate": t.HotGroupRate,
	} {
		if v < 0 {
			bad("%s must not be negative, got %v", name, v)
		}
	}
	if len(errs) == 0 {
		return nil
	}
	slices.SortFunc(errs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) }) // map order: keep the report stable
	return fmt.Errorf("%w: %w", ErrInvalidTuning, errors.Join(errs...))
}

// fill replaces zeros by the defaults documented on Config.
func (t *Tuning) fill() {
	defI := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	defF := func(v *float64, d float64) {
		if *v == 0 {
			*v = d
		}
	}
	defD := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	defD(&t.MergeWindow, 200*time.Millisecond)
	defI(&t.MaxMerge, 256)
	defD(&t.QueueTargetWait, 200*time.Millisecond)
	if t.QueueSafety <= 0 {
		t.QueueSafety = 0.6
	}
	defI(&t.QueueMinBound, 256)
	defI(&t.LargeGroup, 5000)
	defF(&t.GroupRate, 20)
	if t.GroupBuffer <= 0 {
		t.GroupBuffer = max(int(2*t.GroupRate), 1)
	}
	defF(&t.DownlinkRate, 10)
	defF(&t.DownlinkFraction, 0.8)
	if t.AtAllPerDay == 0 {
		t.AtAllPerDay = 10
	}
	defF(&t.ClearFraction, 0.5)
	defD(&t.ClearAfter, 5*time.Second)
	defF(&t.HotFactor, 10)
	defF(&t.HotMinRate, max(t.GroupRate, 1))
	defF(&t.HotBaselineFloor, 1)
	defD(&t.BaselineTau, 10*time.Minute)
	defD(&t.HotClearAfter, 30*time.Second)
	if t.HotGroupRate == 0 {
		t.HotGroupRate = t.GroupRate / 2
		if t.GroupRate < 0 {
			t.HotGroupRate = 10
		}
	}
	if t.HotGroupBuffer <= 0 {
		t.HotGroupBuffer = max(int(2*t.HotGroupRate), 1)
	}
	defF(&t.EgressFraction, 0.6)
	if t.StoreLatencyAlarm == 0 {
		t.StoreLatencyAlarm = time.Second
	}
	defI(&t.StoreClearProbes, 3)
	defF(&t.Tier2MinActiveShare, 0.5)
	defI(&t.Tier2MaxMembers, 50000)
	defD(&t.ActiveWindow, 7*24*time.Hour)
	defD(&t.ActiveRefresh, time.Minute)
}

// Tuning returns the tuning in force, defaults filled in.
func (e *Engine) Tuning() Tuning { return *e.tune.Load() }

// SetTuning validates t, fills in its defaults (zero = default, as in
// Config) and puts it in force: workers use it from their next batch or
// tick, the merge-window tickers of the workers and of tier 2 follow a new
// window, and nothing else is disturbed (queues, buffered sends, group
// state, levels and connections are kept). A changed setting is logged.
// On error nothing changes.
func (e *Engine) SetTuning(t Tuning) error {
	if err := t.Validate(); err != nil {
		return err
	}
	t.fill()
	old := e.tune.Swap(&t)
	if changed := t.Diff(*old); len(changed) > 0 {
		e.cfg.Logger.Info("engine tuning changed", "changed", changed)
	}
	// Wake the tier-2 writer so that its ticker follows a new window now,
	// not after the old period.
	select {
	case e.t2.wake <- struct{}{}:
	default:
	}
	return nil
}

// Diff returns the JSON names of the fields where t and o differ, in field
// order.
func (t Tuning) Diff(o Tuning) []string {
	var out []string
	tv, ov := reflect.ValueOf(t), reflect.ValueOf(o)
	for i, f := range tuningFields {
		if !tv.Field(i).Equal(ov.Field(i)) {
			out = append(out, f.name)
		}
	}
	return out
}

type tuningField struct {
	name string
	dur  bool
}

// tuningFields are Tuning's fields in order, with their JSON names.
var tuningFields = func() []tuningField {
	rt := reflect.TypeFor[Tuning]()
	out := make([]tuningField, rt.NumField())
	for i := range out {
		f := rt.Field(i)
		out[i] = tuningField{name: f.Tag.Get("json"), dur: f.Type == reflect.TypeFor[time.Duration]()}
	}
	return out
}()

// TuningNames returns the JSON names of Tuning's fields, in order.
func TuningNames() []string {
	out := make([]string, len(tuningFields))
	for i, f := range tuningFields {
		out[i] = f.name
	}
	return out
}

// MarshalJSON writes every field under its JSON name, durations as Go
// duration strings.
func (t Tuning) MarshalJSON() ([]byte, error) {
	v := reflect.ValueOf(t)
	b := []byte{'{'}
	for i, f := range tuningFields {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendQuote(b, f.name)
		b = append(b, ':')
		if f.dur {
			b = strconv.AppendQuote(b, time.Duration(v.Field(i).Int()).String())
			continue
		}
		j, err := json.Marshal(v.Field(i).Interface())
		if err != nil {
			return nil, fmt.Errorf("fanout: tuning %s: %w", f.name, err)
		}
		b = append(b, j...)
	}
	return append(b, '}'), nil
}

// UnmarshalJSON reads a whole document: every field is required (a
// forgotten field must not silently become its default), unknown fields
// are refused, durations are Go duration strings.
func (t *Tuning) UnmarshalJSON(b []byte) error {
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&raw); err != nil {
		return err
	}
	if raw == nil {
		return errors.New("fanout: tuning: want a JSON object")
	}
	known := make(map[string]bool, len(tuningFields))
	for _, f := range tuningFields {
		known[f.name] = true
	}
	var unknown []string
	for k := range raw {
		if !known[k] {
			unknown = append(unknown, strconv.Quote(k))
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		// The prefix of encoding/json's own message, so that callers
		// that recognise it (gateway.DecodeJSON) report it alike.
		return fmt.Errorf("json: unknown field %s", strings.Join(unknown, ", "))
	}
	var out Tuning
	v := reflect.ValueOf(&out).Elem()
	var missing []string
	var errs []error
	for i, f := range tuningFields {
		r, ok := raw[f.name]
		if !ok {
			missing = append(missing, f.name)
			continue
		}
		if f.dur {
			var s string
			if err := json.Unmarshal(r, &s); err != nil {
				errs = append(errs, fmt.Errorf("%s: want a duration string such as \"200ms\", got %s", f.name, r))
				continue
			}
			d, err := time.ParseDuration(s)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %v", f.name, err))
				continue
			}
			v.Field(i).SetInt(int64(d))
			continue
		}
		if err := json.Unmarshal(r, v.Field(i).Addr().Interface()); err != nil {
			errs = append(errs, fmt.Errorf("%s: want %s, got %s", f.name, kindName(v.Field(i).Kind()), r))
		}
	}
	if len(missing) > 0 {
		errs = append(errs, fmt.Errorf("missing %s (send the whole document: GET it, change it, PUT it back)", strings.Join(missing, ", ")))
	}
	if len(errs) > 0 {
		return fmt.Errorf("fanout: tuning: %w", errors.Join(errs...))
	}
	*t = out
	return nil
}

func kindName(k reflect.Kind) string {
	switch k {
	case reflect.Bool:
		return "true or false"
	case reflect.Float64:
		return "a number"
	default:
		return "an integer"
	}
}
