package outbox

// AdvisoryClass lets the external tests read the partitions' locks in
// pg_locks.
const AdvisoryClass = advisoryClass
