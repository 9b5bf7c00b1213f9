package command

// HoldGroupBatches makes the create group's batches wait up to timeout
// (a lock_timeout) for a lock, so that a test can hold one in flight.
func HoldGroupBatches(s *Idempotency, timeout string) { s.group.lockTimeout = timeout }

// GroupQueued is how many creates wait in the group's queues.
func GroupQueued(s *Idempotency) int {
	s.group.mu.Lock()
	defer s.group.mu.Unlock()
	n := 0
	for _, q := range s.group.queues {
		n += len(q)
	}
	return n
}
