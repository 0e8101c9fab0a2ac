package core

// WakeTimerOf returns a probe of a subscription's wake-up timer: whether it
// is armed, and whether it was still pending (the probe stops it, so call
// it last). The probe keeps working after the subscription is deleted.
func WakeTimerOf(b *Broker, topic, group string) func() (armed, pending bool) {
	s, err := b.subscription(topic, group)
	if err != nil {
		panic(err)
	}
	return func() (bool, bool) {
		s.lock()
		defer s.mu.Unlock()
		return s.wakeAtMs != 0, s.wakeTimer != nil && s.wakeTimer.Stop()
	}
}
