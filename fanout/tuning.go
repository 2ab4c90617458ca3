// This file holds Tuning, the settings that reload at runtime: each one a
// tagged field, from which validation, defaults, the JSON document and
// fanfared's flags derive. Config (config.go) embeds it.

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

// Tuning is the part of Config that may change while the engine runs
// (docs/architecture.md §13: limits, tiers and thresholds reload without restart):
// merge windows, the Little's Law target, group limits, trigger thresholds
// and hysteresis, hot-group detection and tier 2. Engine.SetTuning swaps it
// atomically; workers read it once per batch or tick, so a change applies
// from the next batch, and connections, queues and group state are kept.
//
// Each field is written here once: its tags are its whole description,
// and everything else is derived from them (TuningSettings): the JSON
// form, Validate, the defaults New and SetTuning fill in, and fanfared's
// flags (name, help text, -h group). The tags:
//
//   - json: the name (admin API, logs, errors); fanfared's flag is the
//     name with dashes (merge_window -> -merge-window).
//   - help: what the setting is, with its unit.
//   - default: what zero means, parsed as the field's type ("200ms",
//     "256"); zero is always the default.
//   - zero: what zero means when it is not one value (a default derived
//     from other fields of the same Tuning, in fill, e.g. "2 x group-rate";
//     or no default).
//   - neg: what a negative value means ("none", "off"); without it a
//     negative value is refused.
//   - max, below: the largest value (inclusive), or the bound a value must
//     stay below.
//   - note: a last remark of the help text (e.g. "1 = every group").
//   - group: the group of fanfared's -h output the flag is listed in.
//
// Engine.Tuning returns the values in force, with the defaults filled in.
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
	// The merge window is at most 10 s: hot groups and groups at L1/L2 get
	// their pushes once per window, and tier 2 writes once per window; a
	// longer wait is worse than a pull.
	MergeWindow time.Duration `json:"merge_window" group:"engine" default:"200ms" max:"10s" help:"L1/L2 merge window and tier-2 write period (at most 10s)"`
	MaxMerge    int           `json:"max_merge" group:"engine" default:"256" help:"messages held per group in one merge window (a full window is pushed early)"`

	// The shard queue's soft bound: service rate x QueueTargetWait x
	// QueueSafety (Little's Law), at least QueueMinBound (and at most the
	// queue's capacity).
	QueueTargetWait time.Duration `json:"queue_target_wait" group:"engine" default:"200ms" help:"shard queue wait the Little's Law bound aims for"`
	QueueSafety     float64       `json:"queue_safety" group:"engine" default:"0.6" max:"1" help:"Little's Law safety factor of the shard queue bound, in (0, 1]"`
	QueueMinBound   int           `json:"queue_min_bound" group:"engine" default:"256" help:"smallest shard queue bound (before a service rate is measured)"`

	// Group limits (docs/architecture.md §8: large groups). Member counts
	// are read from the store in the background, every ActiveRefresh.
	LargeGroup       int     `json:"large_group_members" group:"limits" default:"5000" note:"1 = every group" help:"member count from which group limits and automatic group triggers apply"`
	GroupRate        float64 `json:"group_rate" group:"limits" default:"20" neg:"none" help:"large group message rate limit (msg/s)"`
	GroupBuffer      int     `json:"group_buffer" group:"limits" zero:"2 x group-rate" help:"sends buffered over the group rate (newest kept)"`
	DownlinkRate     float64 `json:"downlink_rate" group:"limits" default:"10" neg:"off" help:"per-member downlink limit of a group (msg/s); above 80% the group goes to L1"`
	DownlinkFraction float64 `json:"downlink_fraction" group:"levels" default:"0.8" max:"1" help:"share of -downlink-rate above which a group goes to L1"`
	AtAllPerDay      int     `json:"at_all_per_day" group:"limits" default:"10" neg:"unlimited" help:"@all messages per group per UTC day"`

	// The hysteresis of every trigger.
	ClearFraction float64       `json:"trigger_clear_fraction" group:"levels" default:"0.5" below:"1" help:"hysteresis: a trigger clears once its measure stays below this share of its threshold"`
	ClearAfter    time.Duration `json:"trigger_clear_after" group:"levels" default:"5s" help:"hysteresis: a trigger clears after its measure stayed below half its threshold this long"`

	// Node triggers: egress (L3), commit latency (L3), store probes (L4).
	EgressBandwidth   int64         `json:"egress_bandwidth" group:"levels" zero:"unknown (off)" help:"node egress bandwidth (bytes/s); above 60% the node goes to L3"`
	EgressFraction    float64       `json:"egress_fraction" group:"levels" default:"0.6" max:"1" help:"share of -egress-bandwidth above which the node goes to L3"`
	StoreLatencyAlarm time.Duration `json:"store_latency_alarm" group:"levels" default:"1s" neg:"off" help:"commit latency that raises the node to L3"`
	StoreClearProbes  int           `json:"store_clear_probes" group:"levels" default:"3" help:"good store pings in a row that clear L4"`

	// Hot groups (docs/architecture.md §9) and their stricter limits.
	HotFactor        float64       `json:"hot_factor" group:"levels" default:"10" neg:"no hot groups" help:"a group above this multiple of its baseline rate is hot"`
	HotMinRate       float64       `json:"hot_min_rate" group:"levels" zero:"group-rate" help:"smallest rate (msg/s) of a hot group"`
	HotBaselineFloor float64       `json:"hot_baseline_floor" group:"levels" default:"1" help:"smallest baseline rate (msg/s) of hot detection"`
	BaselineTau      time.Duration `json:"hot_baseline_tau" group:"levels" default:"10m" help:"time constant of a group's baseline rate"`
	HotClearAfter    time.Duration `json:"hot_clear_after" group:"levels" default:"30s" help:"a hot group cools after its rate stayed below half the threshold this long"`
	HotGroupRate     float64       `json:"hot_group_rate" group:"limits" zero:"group-rate / 2" help:"stricter rate limit of hot groups (msg/s)"`
	HotGroupBuffer   int           `json:"hot_group_buffer" group:"limits" zero:"2 x hot-group-rate" help:"sends buffered over the hot group rate"`

	// Tier 2: conversations.last_seq of active offline members.
	Tier2Off            bool          `json:"tier2_off" group:"engine" help:"turn tier 2 (conversation index of active offline members) off for every group without an admin override"`
	Tier2MinActiveShare float64       `json:"tier2_min_active_share" group:"engine" default:"0.5" max:"1" neg:"no threshold" help:"tier 2 is off for groups whose active share is below this"`
	Tier2MaxMembers     int           `json:"tier2_max_members" group:"engine" default:"50000" help:"tier 2 is off for groups with more active members"`
	ActiveWindow        time.Duration `json:"active_window" group:"engine" default:"168h" help:"members seen within this are active (tier 2)"`
	ActiveRefresh       time.Duration `json:"active_refresh" group:"engine" default:"1m" help:"how often a group's active members and member count are reread"`
}

// TuningSetting describes one field of Tuning, as its tags declare it.
type TuningSetting struct {
	Name  string // JSON name, e.g. merge_window
	Group string // fanfared's -h group
	// Usage is the help text with what zero and negative values mean, as
	// fanfared prints it.
	Usage string

	index       int
	dur         bool
	def         reflect.Value // the default; invalid when there is none
	max, below  reflect.Value // bounds; invalid when there are none
	negOK, flt  bool
	zeroMeaning string
}

// Field returns a pointer to the setting's field in t (*time.Duration,
// *int, *int64, *float64 or *bool).
func (s TuningSetting) Field(t *Tuning) any {
	return reflect.ValueOf(t).Elem().Field(s.index).Addr().Interface()
}

// TuningSettings returns the settings of Tuning, in field order.
func TuningSettings() []TuningSetting { return slices.Clone(tuningSettings) }

// tuningSettings are Tuning's fields in order, read from their tags once.
var tuningSettings = func() []TuningSetting {
	rt := reflect.TypeFor[Tuning]()
	out := make([]TuningSetting, rt.NumField())
	for i := range out {
		f := rt.Field(i)
		s := TuningSetting{
			Name:  f.Tag.Get("json"),
			Group: f.Tag.Get("group"),
			index: i,
			dur:   f.Type == reflect.TypeFor[time.Duration](),
			flt:   f.Type.Kind() == reflect.Float64,
			negOK: f.Tag.Get("neg") != "",
		}
		parse := func(tag string) reflect.Value {
			v, ok := f.Tag.Lookup(tag)
			if !ok {
				return reflect.Value{}
			}
			p, err := parseSetting(f.Type, v)
			if err != nil {
				panic(fmt.Sprintf("fanout: Tuning.%s: tag %s: %v", f.Name, tag, err))
			}
			return p
		}
		s.def, s.max, s.below = parse("default"), parse("max"), parse("below")
		if s.zeroMeaning = f.Tag.Get("default"); s.zeroMeaning == "" {
			s.zeroMeaning = f.Tag.Get("zero")
		}
		if s.Name == "" || s.Group == "" || f.Tag.Get("help") == "" || (s.def.IsValid() && f.Tag.Get("zero") != "") {
			panic(fmt.Sprintf("fanout: Tuning.%s: want json, group and help tags, and default or zero, not both", f.Name))
		}
		s.Usage = f.Tag.Get("help")
		if s.zeroMeaning != "" {
			s.Usage += "; 0 = " + s.zeroMeaning
			if n := f.Tag.Get("note"); n != "" {
				s.Usage += ", " + n
			}
			if n := f.Tag.Get("neg"); n != "" {
				s.Usage += ", negative = " + n
			}
		}
		out[i] = s
	}
	return out
}()

// parseSetting parses a tag's value as a field of type t.
func parseSetting(t reflect.Type, s string) (reflect.Value, error) {
	v := reflect.New(t).Elem()
	switch {
	case t == reflect.TypeFor[time.Duration]():
		d, err := time.ParseDuration(s)
		if err != nil {
			return v, err
		}
		v.SetInt(int64(d))
	case t.Kind() == reflect.Int || t.Kind() == reflect.Int64:
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return v, err
		}
		v.SetInt(n)
	case t.Kind() == reflect.Float64:
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return v, err
		}
		v.SetFloat(f)
	default:
		return v, fmt.Errorf("no default for a %s", t)
	}
	return v, nil
}

// number returns v (an int, int64, Duration or float64 field) as a float.
func number(v reflect.Value) float64 {
	if v.Kind() == reflect.Float64 {
		return v.Float()
	}
	return float64(v.Int())
}

// show formats v as its tag would.
func (s TuningSetting) show(v reflect.Value) string {
	if s.dur {
		return time.Duration(v.Int()).String()
	}
	return fmt.Sprint(v.Interface())
}

// Validate reports every problem of t, as set (zero = default), wrapped in
// ErrInvalidTuning. Names are those of the JSON form; the rules are the
// tags of Tuning (neg, max, below; floats must be finite).
func (t Tuning) Validate() error {
	var errs []error
	tv := reflect.ValueOf(t)
	for _, s := range tuningSettings {
		v := tv.Field(s.index)
		if v.Kind() == reflect.Bool {
			continue
		}
		x := number(v)
		switch {
		case s.flt && (math.IsNaN(x) || math.IsInf(x, 0)):
			errs = append(errs, fmt.Errorf("%s must be a finite number, got %v", s.Name, x))
		case x < 0 && !s.negOK:
			errs = append(errs, fmt.Errorf("%s must not be negative, got %s", s.Name, s.show(v)))
		case s.max.IsValid() && x > number(s.max):
			errs = append(errs, fmt.Errorf("%s must be at most %s (0 = %s), got %s", s.Name, s.show(s.max), s.zeroMeaning, s.show(v)))
		case s.below.IsValid() && x >= number(s.below):
			errs = append(errs, fmt.Errorf("%s must be below %s (0 = %s), got %s", s.Name, s.show(s.below), s.zeroMeaning, s.show(v)))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrInvalidTuning, errors.Join(errs...))
}

// fill replaces zeros by the defaults of the tags, then derives the
// defaults that depend on other fields (the zero tags).
func (t *Tuning) fill() {
	tv := reflect.ValueOf(t).Elem()
	for _, s := range tuningSettings {
		if v := tv.Field(s.index); s.def.IsValid() && v.IsZero() {
			v.Set(s.def)
		}
	}
	if t.GroupBuffer == 0 {
		t.GroupBuffer = max(int(2*t.GroupRate), 1)
	}
	if t.HotMinRate == 0 {
		t.HotMinRate = max(t.GroupRate, 1)
	}
	if t.HotGroupRate == 0 {
		t.HotGroupRate = t.GroupRate / 2
		if t.GroupRate < 0 {
			t.HotGroupRate = 10
		}
	}
	if t.HotGroupBuffer == 0 {
		t.HotGroupBuffer = max(int(2*t.HotGroupRate), 1)
	}
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
	for i, f := range tuningSettings {
		if !tv.Field(i).Equal(ov.Field(i)) {
			out = append(out, f.Name)
		}
	}
	return out
}

// TuningNames returns the JSON names of Tuning's fields, in order.
func TuningNames() []string {
	out := make([]string, len(tuningSettings))
	for i, f := range tuningSettings {
		out[i] = f.Name
	}
	return out
}

// MarshalJSON writes every field under its JSON name, durations as Go
// duration strings.
func (t Tuning) MarshalJSON() ([]byte, error) {
	v := reflect.ValueOf(t)
	b := []byte{'{'}
	for i, f := range tuningSettings {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendQuote(b, f.Name)
		b = append(b, ':')
		if f.dur {
			b = strconv.AppendQuote(b, time.Duration(v.Field(i).Int()).String())
			continue
		}
		j, err := json.Marshal(v.Field(i).Interface())
		if err != nil {
			return nil, fmt.Errorf("fanout: tuning %s: %w", f.Name, err)
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
	known := make(map[string]bool, len(tuningSettings))
	for _, f := range tuningSettings {
		known[f.Name] = true
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
	for i, f := range tuningSettings {
		r, ok := raw[f.Name]
		if !ok {
			missing = append(missing, f.Name)
			continue
		}
		if f.dur {
			var s string
			if err := json.Unmarshal(r, &s); err != nil {
				errs = append(errs, fmt.Errorf("%s: want a duration string such as \"200ms\", got %s", f.Name, r))
				continue
			}
			d, err := time.ParseDuration(s)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %v", f.Name, err))
				continue
			}
			v.Field(i).SetInt(int64(d))
			continue
		}
		if err := json.Unmarshal(r, v.Field(i).Addr().Interface()); err != nil {
			errs = append(errs, fmt.Errorf("%s: want %s, got %s", f.Name, kindName(v.Field(i).Kind()), r))
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
