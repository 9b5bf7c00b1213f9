package fakepsp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/jackc/pgx/v5"
)

// testMethod is how a documented test PaymentMethod behaves.
type testMethod struct {
	code, declineCode, message string // a declined charge: Stripe's error code, decline code, message
	refundFails                bool   // refunds of its charges fail
	action                     bool   // the card asks the customer to authenticate (3D Secure)
}

// TestMethods lists the PaymentMethods the fake knows (Stripe's test
// ids): pm_card_visa and pm_card_mastercard succeed; pm_card_chargeDeclined
// (card_declined / generic_decline), pm_card_chargeDeclinedInsufficientFunds
// (card_declined / insufficient_funds) and pm_card_chargeDeclinedProcessingError
// (processing_error: the issuer failed, try again with a new attempt) are
// declined with 402 card_error and a PaymentIntent in
// requires_payment_method; pm_card_refundFail charges, but its refunds
// fail; pm_card_authenticationRequired (3D Secure) leaves the
// PaymentIntent in requires_action, answered 200, until the customer
// authenticates it (Server.CompleteAuthentication, which charges it) or it is
// cancelled. Any other pm_… is 400 resource_missing.
var testMethods = map[string]testMethod{
	"pm_card_visa":                            {},
	"pm_card_mastercard":                      {},
	"pm_card_chargeDeclined":                  {code: "card_declined", declineCode: "generic_decline", message: "Your card was declined."},
	"pm_card_chargeDeclinedInsufficientFunds": {code: "card_declined", declineCode: "insufficient_funds", message: "Your card has insufficient funds."},
	"pm_card_chargeDeclinedProcessingError":   {code: "processing_error", message: "An error occurred while processing your card. Try again in a little bit."},
	"pm_card_refundFail":                      {refundFails: true},
	"pm_card_authenticationRequired":          {action: true},
}

// MaxAmount is the largest amount of one charge (Stripe's eight digits).
const MaxAmount = 99_999_999

var (
	currencyRE = regexp.MustCompile(`^[a-z]{3}$`)
	// unsupportedCurrencies are ISO 4217 codes Stripe does not take (a
	// few; Stripe's list of those it does is about 135 long).
	unsupportedCurrencies = map[string]bool{"cup": true, "irr": true, "kpw": true, "syp": true}
	metadataRE            = regexp.MustCompile(`^metadata\[([^\[\]]{1,40})\]$`)
	pmTypesRE             = regexp.MustCompile(`^payment_method_types\[\d+\]$`)
)

// parseCommon checks the names of a form against allowed and reads
// metadata[…]; it returns the answer to refuse it with.
func parseCommon(form url.Values, allowed ...string) (map[string]string, *response) {
	meta := map[string]string{}
	for name, vs := range form {
		if m := metadataRE.FindStringSubmatch(name); m != nil {
			if len(vs[0]) > 500 {
				r := invalidRequest(http.StatusBadRequest, "parameter_invalid_string", name, "Metadata values can have up to 500 characters.")
				return nil, &r
			}
			meta[m[1]] = vs[0]
			continue
		}
		known := false
		for _, a := range allowed {
			if name == a || a == "payment_method_types" && pmTypesRE.MatchString(name) {
				known = true
			}
		}
		if !known {
			r := invalidRequest(http.StatusBadRequest, "parameter_unknown", name, "Received unknown parameter: "+name)
			return nil, &r
		}
		if len(vs) != 1 {
			r := invalidRequest(http.StatusBadRequest, "parameter_invalid", name, "Invalid "+name+": sent more than once")
			return nil, &r
		}
	}
	if len(meta) > 50 {
		r := invalidRequest(http.StatusBadRequest, "parameter_invalid", "metadata", "Metadata can have up to 50 keys.")
		return nil, &r
	}
	return meta, nil
}

func parseAmount(form url.Values, required bool) (int64, *response) {
	v := form.Get("amount")
	if v == "" {
		if required {
			r := invalidRequest(http.StatusBadRequest, "parameter_missing", "amount", "Missing required param: amount.")
			return 0, &r
		}
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 1 || n > MaxAmount {
		r := invalidRequest(http.StatusBadRequest, "parameter_invalid_integer", "amount", fmt.Sprintf("Invalid integer: %s (the amount must be 1 to %d)", v, MaxAmount))
		return 0, &r
	}
	return n, nil
}

// createPaymentIntent creates and confirms a PaymentIntent (confirm=true
// only). A decline is stored and answered like Stripe: 402 card_error with
// the PaymentIntent (requires_payment_method, last_payment_error) inside.
func (s *Server) createPaymentIntent(ctx context.Context, tx pgx.Tx, key string, form url.Values) (response, bool, error) {
	meta, bad := parseCommon(form, "amount", "currency", "confirm", "payment_method", "payment_method_types", "description")
	if bad != nil {
		return *bad, false, nil
	}
	amount, bad := parseAmount(form, true)
	if bad != nil {
		return *bad, false, nil
	}
	currency := strings.ToLower(form.Get("currency"))
	if !currencyRE.MatchString(currency) {
		return invalidRequest(http.StatusBadRequest, "parameter_invalid_string", "currency", "Invalid currency: "+form.Get("currency")+". Use a three-letter ISO code."), false, nil
	}
	if unsupportedCurrencies[currency] {
		// Stripe's answer to an ISO code it does not take: no code.
		return invalidRequest(http.StatusBadRequest, "", "currency", "Invalid currency: "+currency+". Stripe currently does not support this currency."), false, nil
	}
	if form.Get("confirm") != "true" {
		return invalidRequest(http.StatusBadRequest, "parameter_invalid", "confirm", "This fake creates PaymentIntents only with confirm=true."), false, nil
	}
	for name, vs := range form {
		if pmTypesRE.MatchString(name) && vs[0] != "card" {
			return invalidRequest(http.StatusBadRequest, "parameter_invalid", name, "This fake supports only the payment method type card."), false, nil
		}
	}
	pm := form.Get("payment_method")
	if pm == "" {
		return invalidRequest(http.StatusBadRequest, "parameter_missing", "payment_method", "Missing required param: payment_method."), false, nil
	}
	method, ok := testMethods[pm]
	if !ok {
		return invalidRequest(http.StatusBadRequest, "resource_missing", "payment_method", "No such PaymentMethod: '"+pm+"'"), false, nil
	}
	status := "succeeded"
	switch {
	case method.code != "":
		status = "requires_payment_method"
	case method.action:
		status = "requires_action"
	}
	metaJSON, err := json.Marshal(meta)
	if err != nil {
		return response{}, false, fmt.Errorf("marshal metadata: %w", err)
	}
	id, chargeID := newID("pi"), newID("ch")
	var created time.Time
	if err := tx.QueryRow(ctx, paymentIntentInsert, id, key, amount, currency, pm, status, chargeID,
		method.declineCode, method.code, method.message, metaJSON).Scan(&created); err != nil {
		return response{}, false, fmt.Errorf("insert payment intent: %w", err)
	}
	pi := LedgerCharge{ID: id, Amount: amount, Currency: currency, PaymentMethod: pm, Status: status, ChargeID: chargeID,
		DeclineCode: method.declineCode, FailureCode: method.code, FailureMessage: method.message, Metadata: meta, CreatedAt: created}.wire()
	if method.code != "" {
		e := *pi.LastPaymentError
		e.PaymentIntent = pi
		return errorResponse(http.StatusPaymentRequired, e), true, nil
	}
	return jsonResponse(http.StatusOK, pi), true, nil
}

// cancelPaymentIntent cancels PaymentIntent id (Stripe's POST
// /v1/payment_intents/{id}/cancel): one not charged (requires_payment_method,
// requires_confirmation, requires_action) becomes canceled and can never
// charge; any other is refused 400 payment_intent_unexpected_state, the
// PaymentIntent as it stands inside, as Stripe does.
func (s *Server) cancelPaymentIntent(id string) endpoint {
	return func(ctx context.Context, tx pgx.Tx, _ string, form url.Values) (response, bool, error) {
		if _, bad := parseCommon(form, "cancellation_reason"); bad != nil {
			return *bad, false, nil
		}
		rows, err := tx.Query(ctx, `SELECT `+piColumns+` FROM payment_intents WHERE id = $1 FOR UPDATE`, id)
		if err != nil {
			return response{}, false, fmt.Errorf("lock payment intent %s: %w", id, err)
		}
		p, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByName[LedgerCharge])
		if errors.Is(err, pgx.ErrNoRows) {
			return invalidRequest(http.StatusNotFound, "resource_missing", "intent", "No such payment_intent: '"+id+"'"), false, nil
		}
		if err != nil {
			return response{}, false, fmt.Errorf("lock payment intent %s: %w", id, err)
		}
		switch p.Status {
		case "requires_payment_method", "requires_confirmation", "requires_action":
		default:
			e := stripeError{Type: errTypeInvalidRequest, Code: "payment_intent_unexpected_state",
				Message:       "You cannot cancel this PaymentIntent because it has a status of " + p.Status + ". Only a PaymentIntent with one of the following statuses may be canceled: requires_payment_method, requires_capture, requires_confirmation, requires_action, processing.",
				PaymentIntent: p.wire()}
			return errorResponse(http.StatusBadRequest, e), true, nil
		}
		if _, err := tx.Exec(ctx, `UPDATE payment_intents SET status = 'canceled' WHERE id = $1`, id); err != nil {
			return response{}, false, fmt.Errorf("cancel payment intent %s: %w", id, err)
		}
		p.Status = "canceled"
		return jsonResponse(http.StatusOK, p.wire()), true, nil
	}
}

// CompleteAuthentication is the customer completing the authentication a
// PaymentIntent in requires_action asks for (3D Secure), as a browser
// would: it charges it. It reports false if the PaymentIntent is in any
// other state (cancelled, say): nothing is charged.
func (s *Server) CompleteAuthentication(ctx context.Context, id string) (bool, error) {
	tag, err := s.pool.Exec(ctx, `UPDATE payment_intents SET status = 'succeeded' WHERE id = $1 AND status = 'requires_action'`, id)
	if err != nil {
		return false, fmt.Errorf("authenticate payment intent %s: %w", id, err)
	}
	return tag.RowsAffected() == 1, nil
}

const paymentIntentInsert = `
INSERT INTO payment_intents (id, idempotency_key, amount, currency, payment_method, status, charge_id,
                             decline_code, failure_code, failure_message, metadata)
VALUES ($1, NULLIF($2, ''), $3, $4, $5, $6, $7, $8, $9, $10, $11)
RETURNING created_at`

// createRefund refunds (part of) a succeeded PaymentIntent; without amount,
// what is left of it. More than is left is refused.
func (s *Server) createRefund(ctx context.Context, tx pgx.Tx, key string, form url.Values) (response, bool, error) {
	meta, bad := parseCommon(form, "payment_intent", "amount", "reason")
	if bad != nil {
		return *bad, false, nil
	}
	amount, bad := parseAmount(form, false)
	if bad != nil {
		return *bad, false, nil
	}
	piID := form.Get("payment_intent")
	if piID == "" {
		return invalidRequest(http.StatusBadRequest, "parameter_missing", "payment_intent", "Missing required param: payment_intent."), false, nil
	}
	var (
		piAmount                  int64
		currency, status, pm, chg string
		refunded                  int64
	)
	err := tx.QueryRow(ctx, paymentIntentLockForRefund, piID).Scan(&piAmount, &currency, &status, &pm, &chg, &refunded)
	if errors.Is(err, pgx.ErrNoRows) {
		return invalidRequest(http.StatusBadRequest, "resource_missing", "payment_intent", "No such payment_intent: '"+piID+"'"), false, nil
	}
	if err != nil {
		return response{}, false, fmt.Errorf("lock payment intent %s: %w", piID, err)
	}
	if status != "succeeded" {
		return invalidRequest(http.StatusBadRequest, "charge_not_refundable", "payment_intent", "This PaymentIntent ("+piID+") does not have a successful charge to refund."), false, nil
	}
	left := piAmount - refunded
	if left == 0 {
		return invalidRequest(http.StatusBadRequest, "charge_already_refunded", "", "Charge "+chg+" has already been refunded."), false, nil
	}
	if amount == 0 {
		amount = left
	}
	if amount > left {
		return invalidRequest(http.StatusBadRequest, "amount_too_large", "amount", fmt.Sprintf("Refund amount (%d) is greater than unrefunded amount on charge (%d)", amount, left)), false, nil
	}
	rf := LedgerRefund{ID: newID("re"), PaymentIntent: piID, ChargeID: chg, Amount: amount, Currency: currency, Status: "succeeded", Metadata: meta}
	if testMethods[pm].refundFails || s.failRefundNow() {
		rf.Status, rf.FailureReason = "failed", "declined"
	}
	metaJSON, err := json.Marshal(meta)
	if err != nil {
		return response{}, false, fmt.Errorf("marshal metadata: %w", err)
	}
	if err := tx.QueryRow(ctx, refundInsert, rf.ID, key, piID, amount, currency, rf.Status, rf.FailureReason, metaJSON).Scan(&rf.CreatedAt); err != nil {
		return response{}, false, fmt.Errorf("insert refund: %w", err)
	}
	return jsonResponse(http.StatusOK, rf.wire()), true, nil
}

const (
	paymentIntentLockForRefund = `
SELECT pi.amount, pi.currency, pi.status, pi.payment_method, pi.charge_id,
       (SELECT COALESCE(sum(r.amount), 0) FROM refunds r WHERE r.payment_intent_id = pi.id AND r.status <> 'failed')
FROM payment_intents pi WHERE pi.id = $1 FOR UPDATE`
	refundInsert = `
INSERT INTO refunds (id, idempotency_key, payment_intent_id, amount, currency, status, failure_reason, metadata)
VALUES ($1, NULLIF($2, ''), $3, $4, $5, $6, $7, $8)
RETURNING created_at`
)

// LedgerCharge is one PaymentIntent in the Ledger (a payment_intents row).
// Status is "succeeded" or, for a declined one, "requires_payment_method"
// (FailureCode and DeclineCode say why); one that asked the customer to
// authenticate is "requires_action" until authenticated ("succeeded") or
// cancelled ("canceled"). Currency is lower case, as Stripe
// writes it.
type LedgerCharge struct {
	ID             string            `db:"id" json:"id"`
	IdempotencyKey *string           `db:"idempotency_key" json:"idempotency_key"`
	Amount         int64             `db:"amount" json:"amount"`
	Currency       string            `db:"currency" json:"currency"`
	PaymentMethod  string            `db:"payment_method" json:"payment_method"`
	Status         string            `db:"status" json:"status"`
	ChargeID       string            `db:"charge_id" json:"charge_id"`
	DeclineCode    string            `db:"decline_code" json:"decline_code"`
	FailureCode    string            `db:"failure_code" json:"failure_code"`
	FailureMessage string            `db:"failure_message" json:"failure_message"`
	Metadata       map[string]string `db:"metadata" json:"metadata"`
	CreatedAt      time.Time         `db:"created_at" json:"created_at"`
}

const piColumns = `id, idempotency_key, amount, currency, payment_method, status, charge_id, decline_code, failure_code, failure_message, metadata, created_at`

func (p LedgerCharge) wire() *paymentIntent {
	pm, charge := p.PaymentMethod, p.ChargeID
	pi := &paymentIntent{
		ID: p.ID, Object: "payment_intent", Amount: p.Amount, CaptureMethod: "automatic", ConfirmationMethod: "automatic",
		Created: unix(p.CreatedAt), Currency: p.Currency, LatestCharge: &charge, Metadata: p.Metadata,
		PaymentMethodTypes: []string{"card"}, Status: p.Status,
	}
	if pi.Metadata == nil {
		pi.Metadata = map[string]string{}
	}
	if p.Status == "succeeded" {
		pi.AmountReceived = p.Amount
		pi.PaymentMethod = &pm
	}
	if p.FailureCode != "" {
		pi.LastPaymentError = &stripeError{Type: errTypeCard, Code: p.FailureCode, DeclineCode: p.DeclineCode,
			Message: p.FailureMessage, Charge: charge, DocURL: "https://stripe.com/docs/error-codes/" + strings.ReplaceAll(p.FailureCode, "_", "-")}
	}
	return pi
}

// LedgerRefund is one Refund in the Ledger (a refunds row). Status is
// "succeeded" or "failed".
type LedgerRefund struct {
	ID             string            `db:"id" json:"id"`
	IdempotencyKey *string           `db:"idempotency_key" json:"idempotency_key"`
	PaymentIntent  string            `db:"payment_intent_id" json:"payment_intent"`
	ChargeID       string            `db:"charge_id" json:"charge_id"`
	Amount         int64             `db:"amount" json:"amount"`
	Currency       string            `db:"currency" json:"currency"`
	Status         string            `db:"status" json:"status"`
	FailureReason  string            `db:"failure_reason" json:"failure_reason"`
	Metadata       map[string]string `db:"metadata" json:"metadata"`
	CreatedAt      time.Time         `db:"created_at" json:"created_at"`
}

func (r LedgerRefund) wire() *refund {
	meta := r.Metadata
	if meta == nil {
		meta = map[string]string{}
	}
	return &refund{ID: r.ID, Object: "refund", Amount: r.Amount, Charge: r.ChargeID, Created: unix(r.CreatedAt),
		Currency: r.Currency, FailureReason: r.FailureReason, Metadata: meta, PaymentIntent: r.PaymentIntent, Status: r.Status}
}

func (s *Server) retrievePaymentIntent(w http.ResponseWriter, r *http.Request) {
	requestID := newID("req")
	id := chi.URLParam(r, "id")
	rows, err := s.pool.Query(r.Context(), `SELECT `+piColumns+` FROM payment_intents WHERE id = $1`, id)
	if err != nil {
		s.internalError(w, r, requestID, fmt.Errorf("get payment intent: %w", err))
		return
	}
	p, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByName[LedgerCharge])
	if errors.Is(err, pgx.ErrNoRows) {
		invalidRequest(http.StatusNotFound, "resource_missing", "intent", "No such payment_intent: '"+id+"'").write(w, requestID)
		return
	}
	if err != nil {
		s.internalError(w, r, requestID, fmt.Errorf("get payment intent: %w", err))
		return
	}
	jsonResponse(http.StatusOK, p.wire()).write(w, requestID)
}

var (
	searchMetadataRE = regexp.MustCompile(`^metadata\['([^']+)'\]:'([^']*)'$`)
	searchStatusRE   = regexp.MustCompile(`^status:'([a-z_]+)'$`)
)

// searchPaymentIntents answers Stripe's search query language in the
// subset metadata['k']:'v' and status:'s' clauses joined by AND, newest
// first. Unlike Stripe's search (up to a minute behind), it sees every
// committed PaymentIntent at once.
func (s *Server) searchPaymentIntents(w http.ResponseWriter, r *http.Request) {
	requestID := newID("req")
	q := r.URL.Query()
	query := strings.TrimSpace(q.Get("query"))
	if query == "" {
		invalidRequest(http.StatusBadRequest, "parameter_missing", "query", "Missing required param: query.").write(w, requestID)
		return
	}
	meta, status := map[string]string{}, ""
	for _, clause := range strings.Split(query, " AND ") {
		clause = strings.TrimSpace(clause)
		if m := searchMetadataRE.FindStringSubmatch(clause); m != nil {
			meta[m[1]] = m[2]
		} else if m := searchStatusRE.FindStringSubmatch(clause); m != nil {
			status = m[1]
		} else {
			invalidRequest(http.StatusBadRequest, "parameter_invalid", "query", "This fake understands only metadata['key']:'value' and status:'value' clauses joined by AND, got: "+clause).write(w, requestID)
			return
		}
	}
	limit, ok := listLimit(w, q, requestID)
	if !ok {
		return
	}
	offset := 0
	if v := q.Get("page"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			invalidRequest(http.StatusBadRequest, "parameter_invalid", "page", "Invalid page: "+v).write(w, requestID)
			return
		}
		offset = n
	}
	metaJSON, err := json.Marshal(meta)
	if err != nil {
		s.internalError(w, r, requestID, fmt.Errorf("marshal search: %w", err))
		return
	}
	rows, _ := s.pool.Query(r.Context(), `SELECT `+piColumns+` FROM payment_intents
WHERE metadata @> $1 AND ($2 = '' OR status = $2) ORDER BY created_at DESC, id DESC LIMIT $3 OFFSET $4`,
		metaJSON, status, limit+1, offset)
	found, err := pgx.CollectRows(rows, pgx.RowToStructByName[LedgerCharge])
	if err != nil {
		s.internalError(w, r, requestID, fmt.Errorf("search payment intents: %w", err))
		return
	}
	res := searchResult{Object: "search_result", Data: []*paymentIntent{}, URL: "/v1/payment_intents/search"}
	if len(found) > limit {
		found = found[:limit]
		next := strconv.Itoa(offset + limit)
		res.HasMore, res.NextPage = true, &next
	}
	for _, p := range found {
		res.Data = append(res.Data, p.wire())
	}
	jsonResponse(http.StatusOK, res).write(w, requestID)
}

// refundColumns are a LedgerRefund's, of refunds r joined with their
// payment_intents pi.
const refundColumns = `r.id, r.idempotency_key, r.payment_intent_id, pi.charge_id, r.amount, r.currency,
       r.status, r.failure_reason, r.metadata, r.created_at`

// listLimit reads a list's limit parameter (1 to 100, default 10), as
// Stripe does; it answers 400 and reports false if it is not one.
func listLimit(w http.ResponseWriter, q url.Values, requestID string) (int, bool) {
	v := q.Get("limit")
	if v == "" {
		return 10, true
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 100 {
		invalidRequest(http.StatusBadRequest, "parameter_invalid_integer", "limit", "limit must be 1 to 100").write(w, requestID)
		return 0, false
	}
	return n, true
}

// listRefunds answers Stripe's GET /v1/refunds: the refunds, newest first,
// of one PaymentIntent (payment_intent) or of all, limit (1 to 100,
// default 10) at a time, the next page starting_after the last id of the
// one before.
func (s *Server) listRefunds(w http.ResponseWriter, r *http.Request) {
	requestID := newID("req")
	q := r.URL.Query()
	for name := range q {
		switch name {
		case "payment_intent", "limit", "starting_after":
		default:
			invalidRequest(http.StatusBadRequest, "parameter_unknown", name, "This fake lists refunds only by payment_intent, limit and starting_after; received: "+name).write(w, requestID)
			return
		}
	}
	limit, ok := listLimit(w, q, requestID)
	if !ok {
		return
	}
	after := q.Get("starting_after")
	if after != "" {
		var exists bool
		if err := s.pool.QueryRow(r.Context(), `SELECT EXISTS (SELECT 1 FROM refunds WHERE id = $1)`, after).Scan(&exists); err != nil {
			s.internalError(w, r, requestID, fmt.Errorf("list refunds: %w", err))
			return
		}
		if !exists {
			invalidRequest(http.StatusBadRequest, "resource_missing", "starting_after", "No such refund: '"+after+"'").write(w, requestID)
			return
		}
	}
	rows, _ := s.pool.Query(r.Context(), `SELECT `+refundColumns+`
FROM refunds r JOIN payment_intents pi ON pi.id = r.payment_intent_id
WHERE ($1 = '' OR r.payment_intent_id = $1)
  AND ($2 = '' OR (r.created_at, r.id) < (SELECT created_at, id FROM refunds WHERE id = $2))
ORDER BY r.created_at DESC, r.id DESC LIMIT $3`, q.Get("payment_intent"), after, limit+1)
	found, err := pgx.CollectRows(rows, pgx.RowToStructByName[LedgerRefund])
	if err != nil {
		s.internalError(w, r, requestID, fmt.Errorf("list refunds: %w", err))
		return
	}
	res := refundList{Object: "list", Data: []*refund{}, URL: "/v1/refunds"}
	if len(found) > limit {
		found, res.HasMore = found[:limit], true
	}
	for _, rf := range found {
		res.Data = append(res.Data, rf.wire())
	}
	jsonResponse(http.StatusOK, res).write(w, requestID)
}

// Ledger is the answer of GET /_ledger: every PaymentIntent ("charge") and
// Refund ever made, oldest first, with the idempotency key that made it.
type Ledger struct {
	Charges []LedgerCharge `json:"charges"`
	Refunds []LedgerRefund `json:"refunds"`
}

// ReadLedger returns the whole ledger.
func (s *Server) ReadLedger(ctx context.Context) (Ledger, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+piColumns+` FROM payment_intents ORDER BY created_at, id`)
	if err != nil {
		return Ledger{}, fmt.Errorf("list payment intents: %w", err)
	}
	charges, err := pgx.CollectRows(rows, pgx.RowToStructByName[LedgerCharge])
	if err != nil {
		return Ledger{}, fmt.Errorf("list payment intents: %w", err)
	}
	rows, err = s.pool.Query(ctx, `SELECT `+refundColumns+`
FROM refunds r JOIN payment_intents pi ON pi.id = r.payment_intent_id ORDER BY r.created_at, r.id`)
	if err != nil {
		return Ledger{}, fmt.Errorf("list refunds: %w", err)
	}
	refunds, err := pgx.CollectRows(rows, pgx.RowToStructByName[LedgerRefund])
	if err != nil {
		return Ledger{}, fmt.Errorf("list refunds: %w", err)
	}
	return Ledger{Charges: charges, Refunds: refunds}, nil
}

func (s *Server) ledger(w http.ResponseWriter, r *http.Request) {
	l, err := s.ReadLedger(r.Context())
	if err != nil {
		s.logger.ErrorContext(r.Context(), "read ledger", "err", err)
		http.Error(w, "read ledger failed", http.StatusInternalServerError)
		return
	}
	writeJSON(w, http.StatusOK, l)
}

func (s *Server) internalError(w http.ResponseWriter, r *http.Request, requestID string, err error) {
	s.logger.ErrorContext(r.Context(), "request failed", "path", r.URL.Path, "request_id", requestID, "err", err)
	errorResponse(http.StatusInternalServerError, stripeError{Type: errTypeAPI, Message: "An unknown error occurred."}).write(w, requestID)
}
