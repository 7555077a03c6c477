// Command agent is the e2e node bed's test workload (tests/e2e/test_node.py).
//
// Plain HTTP (-http, default :8080):
//
//	/healthz  200 "ok" (liveness)
//	/readyz   200 once -ready-after has passed since start, 503 before (readiness)
//	/hello    JSON: pod name (hostname), the address the request came to, the peer
//	/whoami   asks the apiserver who this pod is (SelfSubjectReview) through the
//	          in-cluster "kubernetes" Service, with the pod's projected token
//	/calls    JSON: how many admission reviews this pod answered
//
// HTTPS (-https, default :8443, certificate from -tls-dir/tls.crt and tls.key):
//
//	/validate an AdmissionReview v1 handler: allows everything except objects
//	          labelled e2e-deny, and names this pod in its message
//
// Standard library only, built with CGO_ENABLED=0 into a static binary.
package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"
)

const serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

var (
	started  = time.Now()
	calls    atomic.Int64
	hostname string
)

func main() {
	httpAddr := flag.String("http", ":8080", "plain HTTP listen address")
	httpsAddr := flag.String("https", ":8443", "HTTPS (admission) listen address; empty disables it")
	tlsDir := flag.String("tls-dir", "/tls", "directory with tls.crt and tls.key")
	readyAfter := flag.Duration("ready-after", 0, "answer /readyz with 503 until this long after start")
	flag.Parse()
	hostname, _ = os.Hostname()
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)

	plain := http.NewServeMux()
	plain.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	plain.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if time.Since(started) < *readyAfter {
			http.Error(w, "not ready yet", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ready\n")
	})
	plain.HandleFunc("/hello", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, map[string]string{"pod": hostname, "host": r.Host, "peer": r.RemoteAddr})
	})
	plain.HandleFunc("/whoami", whoami)
	plain.HandleFunc("/calls", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, map[string]int64{"calls": calls.Load()})
	})

	servers := []*http.Server{{Addr: *httpAddr, Handler: logged(plain), ReadHeaderTimeout: 10 * time.Second}}
	if *httpsAddr != "" {
		cert, err := tls.LoadX509KeyPair(*tlsDir+"/tls.crt", *tlsDir+"/tls.key")
		if err != nil {
			log.Fatalf("loading the serving certificate: %v", err)
		}
		secure := http.NewServeMux()
		secure.HandleFunc("/validate", validate)
		servers = append(servers, &http.Server{
			Addr: *httpsAddr, Handler: logged(secure), ReadHeaderTimeout: 10 * time.Second,
			TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		})
	}
	for _, server := range servers {
		listener, err := net.Listen("tcp", server.Addr)
		if err != nil {
			log.Fatalf("listen %s: %v", server.Addr, err)
		}
		log.Printf("agent %s listening on %s (tls=%v)", hostname, server.Addr, server.TLSConfig != nil)
		go func(s *http.Server, l net.Listener) {
			if s.TLSConfig != nil {
				l = tls.NewListener(l, s.TLSConfig)
			}
			if err := s.Serve(l); err != nil && err != http.ErrServerClosed {
				log.Fatalf("serve %s: %v", s.Addr, err)
			}
		}(server, listener)
	}

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	log.Printf("stopping on %v", <-signals)
	for _, server := range servers {
		server.Close()
	}
}

func logged(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		log.Printf("%s %s from %s", r.Method, r.URL.Path, r.RemoteAddr)
		next.ServeHTTP(w, r)
	})
}

func writeJSON(w http.ResponseWriter, value any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(value)
}

// whoami posts a SelfSubjectReview to https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT
// with the projected token, verifying the apiserver against the projected ca.crt.
func whoami(w http.ResponseWriter, _ *http.Request) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		http.Error(w, "KUBERNETES_SERVICE_HOST/PORT not set", http.StatusInternalServerError)
		return
	}
	token, err := os.ReadFile(serviceAccountDir + "/token")
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	caPEM, err := os.ReadFile(serviceAccountDir + "/ca.crt")
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		http.Error(w, "no certificate in ca.crt", http.StatusInternalServerError)
		return
	}
	client := &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{Proxy: nil, TLSClientConfig: &tls.Config{RootCAs: pool}},
	}
	url := "https://" + net.JoinHostPort(host, port) + "/apis/authentication.k8s.io/v1/selfsubjectreviews"
	body := []byte(`{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}`)
	request, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	request.Header.Set("Authorization", "Bearer "+string(bytes.TrimSpace(token)))
	request.Header.Set("Content-Type", "application/json")
	response, err := client.Do(request)
	if err != nil {
		http.Error(w, fmt.Sprintf("calling %s: %v", url, err), http.StatusBadGateway)
		return
	}
	defer response.Body.Close()
	var review struct {
		Status struct {
			UserInfo struct {
				Username string   `json:"username"`
				Groups   []string `json:"groups"`
			} `json:"userInfo"`
		} `json:"status"`
	}
	raw, _ := io.ReadAll(io.LimitReader(response.Body, 1<<20))
	if response.StatusCode != http.StatusCreated && response.StatusCode != http.StatusOK {
		http.Error(w, fmt.Sprintf("%s: %s: %s", url, response.Status, raw), http.StatusBadGateway)
		return
	}
	if err := json.Unmarshal(raw, &review); err != nil {
		http.Error(w, fmt.Sprintf("decoding %s: %v", raw, err), http.StatusBadGateway)
		return
	}
	writeJSON(w, map[string]any{
		"server": url, "username": review.Status.UserInfo.Username, "groups": review.Status.UserInfo.Groups,
	})
}

// validate answers an AdmissionReview v1: allowed unless the object carries the label e2e-deny.
func validate(w http.ResponseWriter, r *http.Request) {
	calls.Add(1)
	var review struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Request    *struct {
			UID    string `json:"uid"`
			Object struct {
				Metadata struct {
					Name   string            `json:"name"`
					Labels map[string]string `json:"labels"`
				} `json:"metadata"`
			} `json:"object"`
		} `json:"request"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 4<<20)).Decode(&review); err != nil || review.Request == nil {
		http.Error(w, "expected an AdmissionReview with a request", http.StatusBadRequest)
		return
	}
	_, deny := review.Request.Object.Metadata.Labels["e2e-deny"]
	response := map[string]any{"uid": review.Request.UID, "allowed": !deny}
	if deny {
		response["status"] = map[string]any{
			"code":    403,
			"message": fmt.Sprintf("denied by agent pod %s: %s carries e2e-deny", hostname, review.Request.Object.Metadata.Name),
		}
	}
	writeJSON(w, map[string]any{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})
}
