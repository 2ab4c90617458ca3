package bus

import (
	"errors"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

type dropReason int

const (
	dropQueueFull   dropReason = iota // publish queue over MaxPendingBytes
	dropUnavailable                   // backend down at Publish
	dropStale                         // queued longer than MaxDelay
	dropError                         // the backend refused the round
	dropTooLarge                      // one message larger than a payload
	dropClosed                        // Publish after Shutdown, or left at Shutdown
	dropInbox                         // received, evicted from the full inbox
	numDropReasons
)

var dropNames = [numDropReasons]string{"queue_full", "unavailable", "stale", "error", "too_large", "closed", "inbox_full"}

type counters struct {
	published, publishedMsgs atomic.Int64
	coalesced                atomic.Int64
	publishErrors            atomic.Int64
	dropped                  [numDropReasons]atomic.Int64
	received, receivedMsgs   atomic.Int64
	delivered, deliveredMsgs atomic.Int64
	self, unsubscribed       atomic.Int64
	decodeErrors             atomic.Int64
	refused, subscribeErrors atomic.Int64
	subscriptions            atomic.Int64
	// Membership changes (payloads), apart from the message counts.
	publishedChanges, deliveredChanges, droppedChanges atomic.Int64
	pendingBytes, inboxBytes                           atomic.Int64
	// Tail hints: published, handed to the handler, dropped (not kept
	// past MaxTails, or evicted from the full inbox).
	tailsPublished, tailsDelivered, tailsDropped atomic.Int64
}

func (c *counters) drop(r dropReason, msgs int) { c.dropped[r].Add(int64(msgs)) }

// Drops counts dropped messages by reason.
type Drops struct {
	QueueFull   int64 // oldest pending payloads evicted, or a batch refused (ErrFull)
	Unavailable int64 // Publish while the backend was down
	Stale       int64 // queued longer than MaxDelay
	Error       int64 // a publish round the backend refused
	TooLarge    int64 // a message larger than MaxPayloadBytes
	Closed      int64 // Publish after Shutdown, or still queued at its end
	Inbox       int64 // received but evicted from the full inbox
}

// Stats counts a Node's work since New.
type Stats struct {
	Published     int64 // payloads the backend took
	PublishedMsgs int64 // messages in them
	Coalesced     int64 // Publish calls appended to a pending payload
	PublishErrors int64 // publish rounds that failed
	Dropped       Drops // messages, by reason
	Received      int64 // payloads from other nodes
	ReceivedMsgs  int64
	Delivered     int64 // payloads handed to the handler
	DeliveredMsgs int64
	Self          int64 // own payloads echoed by the backend, ignored
	Unsubscribed  int64 // payloads for groups no longer subscribed, ignored
	DecodeErrors  int64 // payloads that did not decode, ignored
	Refused       int64 // Subscribe past MaxGroups
	SubErrors     int64 // subscription flushes that failed
	Subscriptions int64 // groups the transport is subscribed to
	PendingBytes  int64 // publish queue, including in flight
	InboxBytes    int64
	// Membership changes (payloads; also counted in Published, Received
	// and Delivered): published, handed to the MembersHandler, and
	// dropped for any reason (queue, backend, inbox, stale).
	PublishedChanges int64
	DeliveredChanges int64
	DroppedChanges   int64
	// Tail hints (payloads; also counted in Published and Delivered):
	// published, handed to the handler, and dropped (not kept past
	// MaxTails, or received and evicted from the full inbox).
	TailsPublished int64
	TailsDelivered int64
	TailsDropped   int64
}

// Stats returns the node's counters.
func (n *Node) Stats() Stats {
	c := &n.st
	return Stats{
		Published:     c.published.Load(),
		PublishedMsgs: c.publishedMsgs.Load(),
		Coalesced:     c.coalesced.Load(),
		PublishErrors: c.publishErrors.Load(),
		Dropped: Drops{
			QueueFull:   c.dropped[dropQueueFull].Load(),
			Unavailable: c.dropped[dropUnavailable].Load(),
			Stale:       c.dropped[dropStale].Load(),
			Error:       c.dropped[dropError].Load(),
			TooLarge:    c.dropped[dropTooLarge].Load(),
			Closed:      c.dropped[dropClosed].Load(),
			Inbox:       c.dropped[dropInbox].Load(),
		},
		Received:      c.received.Load(),
		ReceivedMsgs:  c.receivedMsgs.Load(),
		Delivered:     c.delivered.Load(),
		DeliveredMsgs: c.deliveredMsgs.Load(),
		Self:          c.self.Load(),
		Unsubscribed:  c.unsubscribed.Load(),
		DecodeErrors:  c.decodeErrors.Load(),
		Refused:       c.refused.Load(),
		SubErrors:     c.subscribeErrors.Load(),
		Subscriptions: c.subscriptions.Load(),
		PendingBytes:  c.pendingBytes.Load(),
		InboxBytes:    c.inboxBytes.Load(),

		PublishedChanges: c.publishedChanges.Load(),
		DeliveredChanges: c.deliveredChanges.Load(),
		DroppedChanges:   c.droppedChanges.Load(),

		TailsPublished: c.tailsPublished.Load(),
		TailsDelivered: c.tailsDelivered.Load(),
		TailsDropped:   c.tailsDropped.Load(),
	}
}

// register exports the counters as metrics read at scrape time, so the hot
// paths touch only atomics.
func (n *Node) register(reg prometheus.Registerer) error {
	c := &n.st
	counter := func(name, help string, v *atomic.Int64, labels prometheus.Labels) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels},
			func() float64 { return float64(v.Load()) })
	}
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f)
	}
	cs := []prometheus.Collector{
		counter("fanfare_bus_published_total", "Payloads (one group's batches) published on the bus.", &c.published, nil),
		counter("fanfare_bus_published_messages_total", "Messages published on the bus.", &c.publishedMsgs, nil),
		counter("fanfare_bus_coalesced_total", "Publish calls merged into a payload not sent yet.", &c.coalesced, nil),
		counter("fanfare_bus_publish_errors_total", "Publish rounds the backend refused.", &c.publishErrors, nil),
		counter("fanfare_bus_received_total", "Payloads received from other nodes.", &c.received, nil),
		counter("fanfare_bus_received_messages_total", "Messages received from other nodes.", &c.receivedMsgs, nil),
		counter("fanfare_bus_delivered_total", "Payloads handed to the engine.", &c.delivered, nil),
		counter("fanfare_bus_member_changes_total", "Membership changes on the bus, by result.", &c.publishedChanges, prometheus.Labels{"result": "published"}),
		counter("fanfare_bus_member_changes_total", "Membership changes on the bus, by result.", &c.deliveredChanges, prometheus.Labels{"result": "delivered"}),
		counter("fanfare_bus_member_changes_total", "Membership changes on the bus, by result.", &c.droppedChanges, prometheus.Labels{"result": "dropped"}),
		counter("fanfare_bus_tail_hints_total", "Tail hints (a quiet group's last seq) on the bus, by result.", &c.tailsPublished, prometheus.Labels{"result": "published"}),
		counter("fanfare_bus_tail_hints_total", "Tail hints (a quiet group's last seq) on the bus, by result.", &c.tailsDelivered, prometheus.Labels{"result": "delivered"}),
		counter("fanfare_bus_tail_hints_total", "Tail hints (a quiet group's last seq) on the bus, by result.", &c.tailsDropped, prometheus.Labels{"result": "dropped"}),
		counter("fanfare_bus_decode_errors_total", "Received payloads that did not decode.", &c.decodeErrors, nil),
		counter("fanfare_bus_ignored_total", "Received payloads ignored, by reason.", &c.self, prometheus.Labels{"reason": "self"}),
		counter("fanfare_bus_ignored_total", "Received payloads ignored, by reason.", &c.unsubscribed, prometheus.Labels{"reason": "unsubscribed"}),
		counter("fanfare_bus_subscribe_refused_total", "Subscribe calls past the group bound.", &c.refused, nil),
		counter("fanfare_bus_subscribe_errors_total", "Subscription flushes the backend refused (kept for the reconnect).", &c.subscribeErrors, nil),
		gauge("fanfare_bus_subscriptions", "Groups this node is subscribed to.", func() float64 { return float64(c.subscriptions.Load()) }),
		gauge("fanfare_bus_pending_bytes", "Bytes queued or in flight for publishing.", func() float64 { return float64(c.pendingBytes.Load()) }),
		gauge("fanfare_bus_inbox_bytes", "Received bytes waiting for the engine.", func() float64 { return float64(c.inboxBytes.Load()) }),
		gauge("fanfare_bus_up", "1 while publishing works, 0 while the backend is down.", func() float64 {
			if n.up.Load() {
				return 1
			}
			return 0
		}),
	}
	for r := range numDropReasons {
		cs = append(cs, counter("fanfare_bus_dropped_messages_total", "Messages dropped by the bus, by reason.",
			&c.dropped[r], prometheus.Labels{"reason": dropNames[r]}))
	}
	var errs []error
	for _, col := range cs {
		if err := reg.Register(col); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
