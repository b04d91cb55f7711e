# The Triton Python-backend model written into REPO/<name>/1/model.py by `eagle3-trt package`.
#
# Tensor interface: TensorRT-LLM's Triton llmapi model (see config.pbtxt). model.yaml next to this
# file is upstream's (triton_config + the LLM() options); eagle3.yaml selects the runtime
# (reference | trtllm) and the bundle. The work is done by eagle3_trt.triton_serving.job.LlmServing,
# which drives an object shaped like tensorrt_llm.LLM, as eagle3_trt.runtime.factory.open_llm
# returns it for either runtime. This file is the Triton glue: requests in,
# responses and Prometheus metrics out, and each instance's GPUs and MPI environment.

# The Python backend's embedded interpreter starts in the C (ASCII) locale whatever LANG says;
# torch/transformers imports then fail on non-ASCII source files. Must run before any import.
import locale

try:
    locale.setlocale(locale.LC_ALL, "C.UTF-8")
except locale.Error:
    pass

import os
import site
import sys


def _adopt_path(dirs, drop_system_site=False):
    """Put ``dirs`` first on sys.path, processing their .pth files (editable installs).

    The stub runs Python in isolated mode (PYTHONPATH ignored, base interpreter's
    site-packages visible), so `eagle3-trt serve` passes the launching interpreter's
    path in EAGLE3_SYS_PATH; this must happen before numpy & co. are imported.
    """
    dirs = [d for d in dirs if d and os.path.isdir(d)]
    if not dirs:
        return
    if drop_system_site:
        sys.path[:] = [p for p in sys.path if not p.rstrip("/").endswith(("site-packages", "dist-packages"))]
    before = list(sys.path)
    for d in dirs:
        site.addsitedir(d)
    added = [p for p in sys.path if p not in before]
    sys.path[:] = added + [p for p in before if p not in added]


_adopt_path(
    os.environ.get("EAGLE3_SYS_PATH", os.environ.get("PYTHONPATH", "")).split(os.pathsep),
    drop_system_site=os.environ.get("EAGLE3_DROP_SYSTEM_SITE") == "1",
)

import json  # noqa: E402
import queue  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402
import yaml  # noqa: E402


def _model_dir(args) -> Path:
    return Path(args["model_repository"]) / args["model_version"]


def _model_yaml_path(args) -> Path:
    # Upstream's name and override (llmapi model.py: os.environ.get('LLM_CONFIG_PATH', 'model.yaml')).
    p = Path(os.environ.get("LLM_CONFIG_PATH", "model.yaml"))
    return p if p.is_absolute() else _model_dir(args) / p


def _torch_threads():
    torch = sys.modules.get("torch")
    return torch.get_num_threads() if torch is not None else None


class _Metrics:
    """Custom Prometheus metrics on Triton's metrics port, updated off the request path.

    The MetricFamily objects are kept for the model's lifetime: a collected family makes
    every Metric call fail ("the corresponding 'MetricFamily' has been deleted").
    """

    def __init__(self, model: str, max_draft_len: int):
        C, G, H = pb_utils.MetricFamily.COUNTER, pb_utils.MetricFamily.GAUGE, pb_utils.MetricFamily.HISTOGRAM
        lab = {"model": model}
        self.families = {
            "requests": pb_utils.MetricFamily("eagle3_requests_total", "Requests by outcome (ok, error, cancelled, rejected)", C),
            "tokens": pb_utils.MetricFamily("eagle3_generated_tokens_total", "Output tokens generated, by whether speculation was on", C),
            "draft": pb_utils.MetricFamily("eagle3_draft_tokens_total", "Draft tokens proposed to the target for verification", C),
            "accepted": pb_utils.MetricFamily("eagle3_accepted_draft_tokens_total", "Draft tokens accepted by the target", C),
            "al": pb_utils.MetricFamily("eagle3_acceptance_length", "Tokens produced per target verification step (accepted drafts + 1)", H),
            "drafted_pos": pb_utils.MetricFamily("eagle3_drafted_tokens_by_position_total", "Draft tokens proposed, by draft position (1 = first)", C),
            "accepted_pos": pb_utils.MetricFamily("eagle3_accepted_tokens_by_position_total", "Draft tokens accepted, by draft position (1 = first)", C),
            "spec_off": pb_utils.MetricFamily(
                "eagle3_requests_speculation_off_total", "Requests served without the draft (speculative_decoding=false or a baseline model)", C
            ),
            "active": pb_utils.MetricFamily("eagle3_active_requests", "Requests in flight in the model", G),
        }
        f = self.families
        self.requests = {s: f["requests"].Metric(labels={**lab, "status": s}) for s in ("ok", "error", "cancelled", "rejected")}
        self.tokens = {s: f["tokens"].Metric(labels={**lab, "speculation": s}) for s in ("on", "off")}
        self.draft = f["draft"].Metric(labels=lab)
        self.accepted = f["accepted"].Metric(labels=lab)
        self.al = f["al"].Metric(labels=lab, buckets=[float(i) for i in range(1, max(max_draft_len, 1) + 2)])
        self.drafted_pos = [f["drafted_pos"].Metric(labels={**lab, "position": str(i + 1)}) for i in range(max_draft_len)]
        self.accepted_pos = [f["accepted_pos"].Metric(labels={**lab, "position": str(i + 1)}) for i in range(max_draft_len)]
        self.spec_off = f["spec_off"].Metric(labels=lab)
        self.active = f["active"].Metric(labels=lab)
        self._q: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="eagle3-metrics", daemon=True)
        self._thread.start()

    # Each metric call is a round trip to the Triton process: the thread sums whatever is queued
    # (requests that ended meanwhile, starts, rejections) into one call per metric, so at high
    # concurrency the cost is per batch of requests, not per request. The acceptance-length
    # histogram still gets one observe per verification step (it has no weighted observe).
    def _loop(self) -> None:
        while True:
            items = [self._q.get()]
            while True:
                try:
                    items.append(self._q.get_nowait())
                except queue.Empty:
                    break
            stop = None in items
            try:
                self._apply([i for i in items if i is not None])
            except Exception as e:
                pb_utils.Logger.log_error(f"[eagle3] metrics update failed: {e}")
            if stop:
                return

    def _apply(self, items) -> None:
        active = 0
        requests: dict = {}
        tokens = {"on": 0, "off": 0}
        spec_off = draft = accepted = 0
        als: list = []
        drafted_pos = [0] * len(self.drafted_pos)
        accepted_pos = [0] * len(self.accepted_pos)
        for it in items:
            if isinstance(it, str):  # started | not_started | rejected
                if it == "rejected":
                    requests["rejected"] = requests.get("rejected", 0) + 1
                else:
                    active += 1 if it == "started" else -1
                continue
            s = it
            active -= 1
            requests[s.status] = requests.get(s.status, 0) + 1
            tokens["on" if s.speculation else "off"] += s.generated_tokens
            if not s.speculation:
                spec_off += 1
                continue
            draft += s.draft_tokens
            accepted += s.accepted_tokens
            als += s.step_acceptance_lengths
            for i, v in enumerate(s.drafted_per_position[: len(drafted_pos)]):
                drafted_pos[i] += v
            for i, v in enumerate(s.accepted_per_position[: len(accepted_pos)]):
                accepted_pos[i] += v
        for k, n in tokens.items():
            if n:
                self.tokens[k].increment(n)
        if spec_off:
            self.spec_off.increment(spec_off)
        if draft:
            self.draft.increment(draft)
        if accepted:
            self.accepted.increment(accepted)
        for v in als:
            self.al.observe(float(v))
        for m, v in zip(self.drafted_pos, drafted_pos):
            if v:
                m.increment(v)
        for m, v in zip(self.accepted_pos, accepted_pos):
            if v:
                m.increment(v)
        # Outcome and in-flight counts go last: a reader that sees a request counted as ended
        # (clients.prom.settled_counters waits on exactly that) then sees all of its figures.
        if active:
            self.active.increment(active)
        for status, n in requests.items():
            self.requests[status].increment(n)

    def started(self) -> None:
        self._q.put("started")

    def not_started(self) -> None:
        self._q.put("not_started")

    def rejected(self) -> None:
        self._q.put("rejected")

    def done(self, s) -> None:
        self._q.put(s)

    def close(self) -> None:
        self._q.put(None)
        self._thread.join(timeout=10)


# pb_utils.Tensor and InferenceResponse, bound once in initialize (the stub adds them to pb_utils only
# after importing this file): module globals spare two attribute lookups per response.
_Tensor = _InferenceResponse = None


def _counts(n: int) -> list:
    arrays = []
    for i in range(n):
        a = np.array([i], dtype=np.int32)
        a.flags.writeable = False
        arrays.append(a)
    return arrays


# num_output_tokens of a step: one token (speculation off) or up to max_draft_len + 1, so a few
# shared arrays serve every step; pb_utils.Tensor copies a CPU array into shared memory at send.
_COUNTS = _counts(64)


def _count(n: int):
    return _COUNTS[n] if 0 <= n < len(_COUNTS) else np.array([n], dtype=np.int32)


class _Sink:
    """One request's responses, sent inline through its decoupled response sender.

    After submit, every call comes from the serving loop's thread (job.py's ``Sink``): the
    job's responses, the cancellation polls and the shutdown's errors. The sender is never asked
    is_cancelled() once its final response is sent: Triton frees the response factory with the
    final response, and the backend would then read freed memory (tritonserver 2.51 died with
    SIGSEGV in TRITONBACKEND_ResponseFactoryIsCancelled while `eagle3-trt deploy` loaded a
    version beside streams that were ending). One thread doing both keeps them apart without a
    lock held across a send. Sending on that thread rather than handing each response to a
    response thread (upstream's _response_loop) spares one thread wake-up per decoding step;
    the send waits for the Triton process with the GIL released, so the runtime computes on."""

    __slots__ = ("closed", "dead", "sender", "text_dtype")

    def __init__(self, sender, text_dtype):
        self.sender = sender
        self.text_dtype = text_dtype
        self.dead = False
        self.closed = False

    def emit(self, e) -> None:
        try:
            self._send(e)
        except Exception as ex:  # the client went away: the next poll cancels the request
            self.dead = True
            pb_utils.Logger.log_warn(f"[eagle3] sending a response failed: {ex}")

    def fail(self, message: str, cancelled: bool = False, bad_request: bool = False, unavailable: bool = False) -> None:
        try:
            self._fail(message, cancelled, bad_request, unavailable)
        except Exception as ex:
            self.dead = True
            pb_utils.Logger.log_warn(f"[eagle3] sending a response failed: {ex}")

    def is_cancelled(self) -> bool:
        return self.dead or (not self.closed and bool(self.sender.is_cancelled()))

    def _send(self, e) -> None:
        if e.perf is None and not e.final:
            # A decoding step's response (the hot path): the two tensors upstream sends and nothing
            # else to build; the count's array is shared (read-only: the send copies it out).
            self.sender.send(
                _InferenceResponse([_Tensor("text_output", np.array([e.text.encode()], self.text_dtype)), _Tensor("num_output_tokens", _count(e.n_tokens))]),
                0,
            )
            return
        out = [
            _Tensor("text_output", np.array([e.text.encode()], self.text_dtype)),
            _Tensor("num_output_tokens", _count(e.n_tokens)),
        ]
        if e.final:
            out.append(_Tensor("finish_reason", np.array([e.finish_reason.encode()], dtype=np.object_)))
            if e.stop_reason is not None:
                out.append(_Tensor("stop_reason", np.array([e.stop_reason.encode()], dtype=np.object_)))
        p = e.perf
        if p is not None:
            out += [
                _Tensor("arrival_time_ns", np.array([p.arrival_ns], dtype=np.int64)),
                _Tensor("first_scheduled_time_ns", np.array([p.first_scheduled_ns], dtype=np.int64)),
                _Tensor("first_token_time_ns", np.array([p.first_token_ns], dtype=np.int64)),
                _Tensor("last_token_time_ns", np.array([p.last_token_ns], dtype=np.int64)),
                _Tensor("acceptance_rate", np.array([p.acceptance_rate], dtype=np.float32)),
                _Tensor("total_accepted_draft_tokens", np.array([p.accepted_tokens], dtype=np.int32)),
                _Tensor("total_draft_tokens", np.array([p.draft_tokens], dtype=np.int32)),
                _Tensor("acceptance_length", np.array([p.acceptance_length], dtype=np.float32)),
                _Tensor("speculative_decoding", np.array([p.speculation], dtype=np.bool_)),
            ]
        if not e.final:
            self.sender.send(_InferenceResponse(out), 0)
            return
        self.closed = True
        self.sender.send(_InferenceResponse(out), pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _fail(self, message: str, cancelled: bool, bad_request: bool = False, unavailable: bool = False) -> None:
        # INVALID_ARG is what makes Triton answer HTTP 400 (and gRPC INVALID_ARGUMENT) instead of 500;
        # UNAVAILABLE (server shutting down) tells a client to retry elsewhere.
        name = "CANCELLED" if cancelled else "INVALID_ARG" if bad_request else "UNAVAILABLE" if unavailable else None
        code = getattr(pb_utils.TritonError, name, None) if name else None
        err = pb_utils.TritonError(message, code) if code is not None else pb_utils.TritonError(message)
        self.closed = True
        self.sender.send(pb_utils.InferenceResponse(error=err), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


def _request_parameters(request) -> dict:
    try:
        return json.loads(request.parameters() or "{}")
    except Exception:
        return {}


class TritonPythonModel:
    def initialize(self, args):
        global _Tensor, _InferenceResponse
        _Tensor, _InferenceResponse = pb_utils.Tensor, pb_utils.InferenceResponse
        self.model_name = args["model_name"]
        self.model_version = args["model_version"]
        # Finalize (Triton unloading the version) and retiring (the instance ending itself) exclude each other.
        self._life_lock = threading.Lock()
        self._ending = False
        mdir = _model_dir(args)
        yaml_path = _model_yaml_path(args)
        serving_path = mdir / "eagle3.yaml"
        raw = yaml.safe_load(serving_path.read_text()) if serving_path.is_file() else None
        if not isinstance(raw, dict):
            raise pb_utils.TritonModelException(f"{serving_path}: missing or not a mapping; regenerate with `eagle3-trt package`")
        _adopt_path(raw.get("python_path") or [])

        # eagle3_trt is importable only now that eagle3.yaml's python_path is on sys.path (the stub
        # runs Python isolated, PYTHONPATH ignored). instances is light (no torch, no CUDA): the
        # instance's GPUs and the MPI clean-up are applied before any runtime module is imported.
        from eagle3_trt.errors import UserError
        from eagle3_trt.triton_serving.instances import instance_environment

        model_config = json.loads(args["model_config"])
        params = model_config.get("parameters", {})
        count = int(model_config.get("instance_group", [{}])[0].get("count", 1))
        try:
            env, llm_extra = instance_environment(
                os.environ,
                gpu_device_ids=params.get("gpu_device_ids", {}).get("string_value", ""),
                instance_count=count,
                model_instance_name=args.get("model_instance_name", ""),
                require_gpus=raw.get("runtime") == "trtllm",
            )
        except UserError as e:
            raise pb_utils.TritonModelException(e.line()) from None
        for k in [k for k in os.environ if k not in env]:
            del os.environ[k]
        os.environ.update(env)

        from eagle3_trt.triton_serving.draining import DrainWatch
        from eagle3_trt.triton_serving.job import Emission, LlmServing
        from eagle3_trt.triton_serving.model_yaml import load_model_yaml, load_serving_yaml, read_bundle, resolve_bundle
        from eagle3_trt.triton_serving.request_params import RequestError, check_parameters, parse_request

        self._Emission = Emission
        self._RequestError = RequestError
        self._parse = parse_request
        self._check_parameters = check_parameters
        try:
            cfg = load_serving_yaml(serving_path)
            my = load_model_yaml(yaml_path)
            info = read_bundle(resolve_bundle(cfg, serving_path))
        except UserError as e:
            raise pb_utils.TritonModelException(e.line()) from None
        decoupled = bool(pb_utils.using_decoupled_model_transaction_policy(model_config))
        if decoupled != my.triton_config.decoupled:
            raise pb_utils.TritonModelException(
                f"config.pbtxt decoupled={decoupled} but {yaml_path} triton_config.decoupled={my.triton_config.decoupled}; regenerate with `eagle3-trt package`"
            )
        self.text_dtype = pb_utils.triton_string_to_numpy(pb_utils.get_output_config_by_name(model_config, "text_output")["data_type"])

        t0 = time.monotonic()
        # open_llm imports TensorRT-LLM only for the trtllm runtime (after the instance's GPUs were
        # set above). model.yaml's LLM() options are the ones TensorRT-LLM gets, as upstream's
        # model.py would read them from the same file.
        from eagle3_trt.runtime.factory import open_llm

        if cfg.runtime == "reference":
            opts = {"device": cfg.device, "torch_threads": cfg.torch_threads}
        else:
            opts = {"llm_kwargs": my.llm_kwargs, "llm_extra": llm_extra}
        try:
            llm = open_llm(info.bundle, cfg.runtime, speculation=cfg.speculation, **opts)
        except UserError as e:
            raise pb_utils.TritonModelException(e.line()) from None
        self.metrics = _Metrics(self.model_name, info.max_draft_len if cfg.speculation else 0)
        self.serving = LlmServing(
            llm,
            max_seq_len=info.max_seq_len,
            max_draft_len=info.max_draft_len,
            speculation=cfg.speculation,
            default_max_tokens=cfg.default_max_tokens,
            cancel_period_ms=my.triton_config.cancellation_check_period_ms,
            decoupled=decoupled,
            on_done=lambda s: self.metrics.done(s),
            log=lambda m: pb_utils.Logger.log_warn(f"[eagle3] {m}"),
            # `eagle3-trt stop` marks when its drain window ends (Triton does not tell the model it is draining),
            # and `eagle3-trt deploy` marks the stubs of the version it replaced.
            drain=DrainWatch.for_parent(),
            on_retire=self._retire,
        )
        pb_utils.Logger.log_info(
            f"[eagle3] model '{self.model_name}' ready: runtime={cfg.runtime} bundle={info.path} "
            f"speculation={cfg.speculation} decoupled={decoupled} max_seq_len={info.max_seq_len} "
            f"max_draft_len={info.max_draft_len} gpus={env.get('CUDA_VISIBLE_DEVICES', '(all visible)')} "
            f"torch_threads={_torch_threads()} ({time.monotonic() - t0:.1f} s)"
        )

    def execute(self, requests):
        self.serving.touch()
        for request in requests:
            arrival = time.monotonic_ns()
            sink = _Sink(request.get_response_sender(), self.text_dtype)

            def get(name, _r=request):
                t = pb_utils.get_input_tensor_by_name(_r, name)
                return None if t is None else t.as_numpy()

            try:
                params = _request_parameters(request)
                self._check_parameters(params)
                req = self._parse(get)
                if req.stop_request:
                    n = self.serving.stop_request(request.request_id())
                    if n == 0:
                        sink.fail(f"stop: no request in flight with id '{request.request_id()}'", bad_request=True)
                    else:  # the cancelled request ends with a CANCELLED error; this one succeeds
                        sink.emit(self._Emission("", 0, True, "cancelled"))
                    continue
                self.metrics.started()
                try:
                    self.serving.submit(req, sink, request.request_id(), arrival, category=params.get("eagle3_category"))
                except BaseException:
                    self.metrics.not_started()
                    raise
            except self._RequestError as e:
                self.metrics.rejected()
                sink.fail(str(e), bad_request=True)
            except Exception as e:
                self.metrics.rejected()
                pb_utils.Logger.log_error(f"[eagle3] request failed: {type(e).__name__}: {e}")
                sink.fail(f"internal error: {type(e).__name__}: {e}")
        return None

    def _retire(self, why: str) -> None:
        """A stop or a deploy asked this instance to go and it has nothing in flight, but Triton has
        not finalized it: a gRPC stream that sent it a request is still open, and tritonserver 2.51
        keeps the version live until that stream closes (draining.py). Its runtime and this stub end
        here; Triton finds the stub gone when it finally releases the version."""
        with self._life_lock:
            if self._ending:
                return
            self._ending = True
        pb_utils.Logger.log_warn(
            f"[eagle3] model '{self.model_name}' version {self.model_version}: retired by {why} with nothing in flight, "
            "but an open gRPC stream still holds it in Triton; ending its runtime and this backend stub (pid "
            f"{os.getpid()})"
        )
        try:
            self._close()
        finally:
            watch = self.serving.drain
            if watch is not None and watch.retire_path is not None:
                watch.retire_path.unlink(missing_ok=True)
            os._exit(0)

    def finalize(self):
        with self._life_lock:
            if self._ending:
                return
            self._ending = True
        self._close()

    def _close(self):
        serving = getattr(self, "serving", None)
        if serving is not None:
            serving.shutdown()
        metrics = getattr(self, "metrics", None)
        if metrics is not None:
            metrics.close()
