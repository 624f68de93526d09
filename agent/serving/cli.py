"""The `duplex` command: serve, talk, run, asr-serve, asr-bench, trace, bench."""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import sys
from dataclasses import replace

from agent.conversation.endpointing import DEFAULT_POLICY, POLICIES, policy_named
from agent.conversation.overlap import DEFAULT_STYLE, STYLES
from llm import bundled


def positive_int(text: str) -> int:
    """argparse type: an integer of at least 1."""
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {n}")
    return n


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--asr", default="whisper-tiny.en",
                   help="recognizer: whisper-tiny.en (default, embedded) or another Whisper size | "
                        "kyutai/stt-1b-en_fr, kyutai/stt-2.6b-en or a Kyutai STT checkpoint directory (the "
                        "batched engine in this process, one slot per conversation) | ws://HOST:PORT[/path], "
                        "comma-separated for several (a Kyutai-protocol server: duplex asr-serve, moshi-server)")
    p.add_argument("--asr-api-key", default=None, help="API key for a ws:// recognizer (kyutai-api-key)")
    p.add_argument("--asr-slots", type=positive_int, default=8,
                   help="conversations the in-process engine serves at once (its batch size; default 8)")
    p.add_argument("--device", default="cpu", help="where the in-process engine runs: cpu (default) or cuda")
    p.add_argument("--asr-beam", type=positive_int, default=None,
                   help="the beam of Whisper's final decode (default 5; 1, greedy: dev WER 5.0 -> 9.9 %% for "
                        "~20-46 ms less a final, see docs/quality.md); partials stay greedy")
    p.add_argument("--asr-recheck", choices=["unsure", "never"], default="unsure",
                   help="unsure (the default): decode an unsure Whisper final again on the full 30 s window and "
                        "keep the surer answer; never: every final at the short window's cost (docs/quality.md)")
    p.add_argument("--llm", default=bundled.DEFAULT,
                   help=f"{bundled.names_help()} | path to a .gguf | "
                        "URL of an OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1 | "
                        "hf:NAME, a transformers model (hub id, directory, .gguf or bundled name)")
    p.add_argument("--llm-timeout", type=float, default=5.0,
                   help="seconds an --llm URL server may take for its first token, and between two tokens, "
                        "before the reply fails and the user hears a short apology (default 5; 0: no limit)")
    p.add_argument("--llm-model", default=None,
                   help="model name at an OpenAI-compatible --llm URL (default: the first it lists)")
    p.add_argument("--tts", default="piper", help="piper (default, joe voice) | voice.onnx | espeak-ng | flite")
    p.add_argument("--system-prompt", default=None, help="system message for the LLM")
    p.add_argument("--mode", choices=["concurrent", "waterfall"], default="concurrent",
                   help="run stages concurrently (default) or strictly one after another")
    p.add_argument("--max-tokens", type=int, default=80)
    p.add_argument("--first-chunk-words", type=positive_int, default=2,
                   help="words of the reply's first TTS chunk (fewer: first audio sooner, one more join)")
    p.add_argument("--no-eou", action="store_true",
                   help="end turns on silence alone (--endpoint-silence, 0.5 s), without the smart-turn "
                        "model: the same as --endpointing silence")
    p.add_argument("--endpointing", choices=list(POLICIES), default=DEFAULT_POLICY,
                   help="end-of-turn policy (see duplex bench turns): combined (default: smart-turn's audio "
                        "score with a text model's end-of-message probability; loads SmolLM2-135M too), "
                        "rules (smart-turn, then the transcript's punctuation and the pause), smart-turn alone, "
                        "or silence (no turn model)")
    p.add_argument("--endpoint-silence", type=float, default=None, metavar="S",
                   help="rules: the silence that ends a turn whose transcript ends a sentence; --no-eou: the "
                        "silence that ends every turn (default 0.5 s; what pipecat calls the VAD's stop_secs)")
    p.add_argument("--endpoint-max-silence", type=float, default=None, metavar="S",
                   help="rules and smart-turn: the silence that ends a turn no verdict ended sooner (default "
                        "1.5 s; longer for a patient listener, or a slow machine whose decode comes late)")
    p.add_argument("--no-speculation", action="store_true", help="never start replies before the turn ends")
    p.add_argument("--overlap", choices=list(STYLES), default=DEFAULT_STYLE,
                   help="speech over the bot: responsive (stop for any), balanced (go on through backchannels "
                        "and quiet voices; the default) or floor-holding (yield only to 0.5 s of speech); "
                        "docs/turn-taking.md")
    p.add_argument("--agent", default=None, metavar="MODULE:ATTR",
                   help="serve this agent.Agent (instructions, tools, greeting): a module or a file.py, "
                        "e.g. examples/weather_agent.py:agent; its instructions replace --system-prompt")
    p.add_argument("--greeting", default=None,
                   help="say this first, as soon as the caller's or page's audio arrives (kept in the context)")


def _session_config(args):
    from agent.conversation.session import SessionConfig
    from llm.openai_compat import is_endpoint

    # an LLM server can be down or stalled; the embedded model is only ever slow (load, which
    # admission bounds), and an apology would not make it faster
    timeout = (args.llm_timeout or None) if is_endpoint(args.llm) else None
    cfg = SessionConfig(mode=args.mode, max_tokens=args.max_tokens, speculate=not args.no_speculation,
                        first_chunk_words=args.first_chunk_words, llm_timeout_s=timeout)
    cfg.turns = STYLES[args.overlap].apply(replace(cfg.turns, endpointing=_policy(args)))
    if args.system_prompt:
        cfg.system_prompt = args.system_prompt
    cfg.greeting = args.greeting or None
    return cfg


def _agent(args):
    """--agent MODULE:ATTR -> the Agent there; without it, None (the default agent of the session
    config: --system-prompt, --greeting)."""
    if not args.agent:
        return None
    from agent.toolkit.voice_agent import load_agent

    loaded = load_agent(args.agent)
    if args.greeting and not loaded.greeting:
        loaded.greeting = args.greeting
    return loaded


def _trace_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", action="store_true",
                   help="also wrap the run in torch.profiler; its trace goes next to ours (*.torch.json)")


def _write_trace(tracer, path: str) -> None:
    from agent.tracing.export import write_trace

    write_trace(tracer, path)


async def _run_traced(session, tracer) -> None:
    from agent.tracing.profiling import run_traced

    await run_traced(session, tracer)


def _profiling(args, trace_path: str | None):
    import contextlib

    if not getattr(args, "profile", False):
        return contextlib.nullcontext()
    from agent.tracing.profiling import profile_path_for, torch_profiler

    return torch_profiler(profile_path_for(trace_path or "duplex.trace.json"))


def _load(args):
    from agent.conversation.models import ModelChoice, load_models

    return load_models(ModelChoice(asr=args.asr, asr_api_key=args.asr_api_key, asr_slots=args.asr_slots,
                                   asr_beam=args.asr_beam, asr_recheck=args.asr_recheck == "unsure",
                                   device=args.device, llm=args.llm,
                                   llm_model=args.llm_model, tts=args.tts,
                                   endpointing=_policy(args)))


def _policy(args):
    """The end-of-turn policy that --endpointing, --no-eou and --endpoint-silence name."""
    name = "silence" if args.no_eou else args.endpointing
    if args.endpoint_silence is not None and not 0.0 < args.endpoint_silence <= 1.5:
        raise SystemExit("--endpoint-silence must be above 0 and at most 1.5 s")
    if args.endpoint_silence is not None and name not in ("rules", "silence"):
        raise SystemExit("--endpoint-silence is for --endpointing rules or silence (or --no-eou)")
    policy = policy_named(name, args.endpoint_silence)
    if args.endpoint_max_silence is not None:
        if not hasattr(policy, "max_silence_s"):
            raise SystemExit("--endpoint-max-silence is for --endpointing rules or smart-turn")
        if not 0.0 < args.endpoint_max_silence <= 10.0:
            raise SystemExit("--endpoint-max-silence must be above 0 and at most 10 s")
        policy = replace(policy, max_silence_s=args.endpoint_max_silence)
    return policy


def _engine_of(recognizer):
    """The recognizer if it is the in-process engine, else None. Its module is looked at only if
    loading the models imported it: importing it brings torch (seconds) to every other setup."""
    module = sys.modules.get("asr.engine.recognizer")
    return recognizer if module is not None and isinstance(recognizer, module.EngineRecognizer) else None


def _listener(spec: str):
    """--listener MODULE:FUNCTION[=ARG] -> (its name, FUNCTION(ARG) or FUNCTION())."""
    import importlib

    target, _, arg = spec.partition("=")
    module, _, function = target.partition(":")
    if not module or not function:
        raise SystemExit(f"duplex serve: --listener {spec!r}: expected MODULE:FUNCTION[=ARG]")
    make = getattr(importlib.import_module(module), function)
    return spec, make(arg) if arg else make()


def cmd_serve(args) -> int:
    import signal

    from agent.serving.load import LoadPolicy
    from agent.serving.holding import HoldingPolicy
    from agent.serving.server import ServeConfig, Server, route_guards, steady_malloc
    from transport.limits import SourcePolicy
    from transport.telephony.signatures import carrier_guards, unguarded_routes

    steady_malloc()
    guards = carrier_guards(twilio_auth_token=args.twilio_auth_token, plivo_auth_token=args.plivo_auth_token,
                            vonage_signature_secret=args.vonage_signature_secret,
                            vonage_application_id=args.vonage_application_id, auth_token=args.auth_token,
                            public_url=args.public_url)
    if open_routes := unguarded_routes(guards):
        logging.getLogger("duplex.serve").warning(
            "phone routes %s are open to anyone who can reach the port (set --auth-token or a carrier's secret)",
            ", ".join(open_routes))
    config = ServeConfig(host=args.host, port=args.port, audiosocket_port=args.audiosocket, guards=guards,
                         max_sessions=args.max_sessions, load=LoadPolicy(cpu_threshold=args.load_threshold),
                         drain_timeout_s=args.drain_timeout, trace_dir=args.trace_dir, auth_token=args.auth_token,
                         allowed_origins=args.allowed_origin or [], certfile=args.certfile, keyfile=args.keyfile,
                         allowed_hosts=args.allowed_host or [], public_url=args.public_url,
                         insecure_no_auth=args.insecure_no_auth,
                         holding=HoldingPolicy(idle_s=args.idle_timeout, max_call_s=args.max_call),
                         sources=SourcePolicy(max_live=args.max_per_source, per_minute=args.connect_rate,
                                              trusted_proxies=tuple(args.trusted_proxy or ())),
                         metrics_port=args.metrics_port,
                         audiosocket_allow=args.audiosocket_allow or ["127.0.0.0/8", "::1/128"],
                         ice_hosts=args.ice_host or [], ice_servers=args.ice_server or [],
                         turn_secret=args.turn_secret, turn_ttl_s=args.turn_ttl,
                         listeners=dict(map(_listener, args.listener or [])))
    try:  # a bad WebRTC setting, or an open server off loopback, stops here, before the models load
        config.webrtc_options()
        if (error := config.exposure_error()) is not None:
            raise ValueError(error)
    except ValueError as exc:
        raise SystemExit(f"duplex serve: {exc}") from None
    models = _load(args)

    async def serve() -> None:
        server = Server(models, _session_config(args), config, engine=_engine_of(models.asr), agent=_agent(args))
        server.metrics.show_recognizer_pool(models.asr)  # a ws:// pool's failovers and gaps, if it is one
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):  # the first drains; a second ends at once
            loop.add_signal_handler(sig, server.drain)
        print(f"duplex: phone media streams at ws://{args.host}:{args.port}/twilio, /telnyx, /plivo, /exotel "
              f"and /vonage (see docs/telephony.md)", flush=True)
        for line, _ in route_guards(config, config.phone_guards()):  # who may open what
            print(f"duplex: guard: {line}", flush=True)
        await server.run()
        print("duplex: drained; bye", flush=True)

    with _profiling(args, os.path.join(args.trace_dir or ".", "serve.trace.json")):
        asyncio.run(serve())
    return 0


def cmd_run(args) -> int:
    from agent.conversation.session import Session
    from transport.wavfile import WavConversationTransport, load_turn

    models = _load(args)
    turns = [load_turn(*_parse_input(p)) for p in args.input]
    transport = WavConversationTransport(turns, models.tts.sample_rate, args.output, gap_s=args.gap,
                                         reply_timeout_s=args.reply_timeout, realtime=not args.fast)
    from agent.tracing.trace import Tracer

    tracer = Tracer("run", capacity=1 << 18) if args.trace else None
    session = Session(models, transport, _session_config(args), tracer=tracer, session_id="run", agent=_agent(args))
    try:
        with _profiling(args, args.trace):
            asyncio.run(_run_traced(session, tracer))
    finally:
        transport.close()
        if tracer is not None:
            _write_trace(tracer, args.trace)
    rows = [r.summary() for r in session.records]
    log_file = open(args.log, "w") if args.log else None
    for row in rows:
        line = json.dumps(row)
        print(line)
        if log_file:
            log_file.write(line + "\n")
    v2v = [r["voice_to_voice_ms"] for r in rows if r["voice_to_voice_ms"] is not None]
    summary = {"summary": True, "turns": len(rows), "replied": len(v2v), "output": args.output,
               "voice_to_voice_p50_ms": round(statistics.median(v2v), 1) if v2v else None,
               "voice_to_voice_max_ms": round(max(v2v), 1) if v2v else None, "mode": args.mode,
               "speculation": session.speculation_stats, "history": session.history,
               "clears": [e["t"] for e in transport.events_log if e["type"] == "clear"]}
    if args.far_end_log:
        with open(args.far_end_log, "w") as f:
            for e in transport.events_log:
                f.write(json.dumps(e) + "\n")
    print(json.dumps(summary))
    if log_file:
        log_file.write(json.dumps(summary) + "\n")
        log_file.close()
    return 0 if v2v else 1


def cmd_talk(args) -> int:
    """A conversation through the local microphone and speaker."""
    if args.list_devices:
        import sounddevice as sd

        print(sd.query_devices())
        return 0
    from agent.conversation.session import Session
    from agent.tracing.trace import Tracer
    from transport.local_audio import LocalAudioTransport

    models = _load(args)
    device = lambda d: int(d) if d is not None and d.isdigit() else d  # noqa: E731
    transport = LocalAudioTransport(device(args.input_device), device(args.output_device), duration_s=args.seconds)
    tracer = Tracer("talk", capacity=1 << 18) if args.trace else None
    session = Session(models, transport, _session_config(args), tracer=tracer, session_id="talk", agent=_agent(args))

    async def talk() -> None:
        await transport.start()
        print(f"duplex: listening (mic {args.input_device or 'default'}, speaker {args.output_device or 'default'}; "
              f"use headphones: there is no echo cancellation). Ctrl-C ends.", flush=True)
        try:
            await _run_traced(session, tracer)
        finally:
            await transport.close()

    try:
        with _profiling(args, args.trace):
            asyncio.run(talk())
    except KeyboardInterrupt:
        pass
    finally:
        if tracer is not None:
            _write_trace(tracer, args.trace)
    for rec in session.records:
        print(json.dumps(rec.summary()))
    if transport.dropped_blocks:
        print(f"duplex: {transport.dropped_blocks} microphone blocks of 20 ms were dropped (the session fell behind)")
    return 0


def _parse_input(spec: str) -> tuple[str, float | None, bool]:
    """FILE, FILE@+S (S seconds after the previous input ended) or FILE@reply+S (after the reply
    to it began playing): the path, S, and whether S counts from the reply."""
    for mark, from_reply in (("@reply+", True), ("@+", False)):
        path, sep, offset = spec.rpartition(mark)
        if sep and path:
            return path, float(offset), from_reply
    return spec, None, False


def _delegate(module: str, argv: list[str]) -> int:
    import importlib

    return int(importlib.import_module(module).main(argv) or 0)


# sub-tools with their own argument parsers: the command's words -> (module, how many of the
# words the module's own parser reads: `load` and `soak` are both bench.load's)
SUB_TOOLS = {
    ("asr-serve",): ("asr.serving.server", 0), ("asr-bench",): ("asr.bench.load", 0),
    ("trace", "report"): ("agent.tracing.report", 0), ("bench", "latency"): ("agent.bench.latency", 0),
    ("bench", "quality"): ("agent.bench.quality", 0), ("bench", "tools"): ("agent.bench.tools", 0),
    ("bench", "turns"): ("agent.bench.turns", 0), ("bench", "pipecat"): ("agent.bench.pipecat_peer", 0),
    ("bench", "load"): ("agent.bench.load", 1), ("bench", "soak"): ("agent.bench.load", 1),
    ("bench", "overlap"): ("agent.bench.overlap", 0),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from agent.conversation.models import configure_openmp

    configure_openmp()  # before any model library loads
    # sub-tools with their own argument parsers
    for words, (module, keep) in SUB_TOOLS.items():
        if tuple(argv[:len(words)]) == words:
            return _delegate(module, argv[len(words) - keep:])

    parser = argparse.ArgumentParser(prog="duplex", description="A full-duplex voice agent that runs offline.")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="serve the browser agent over HTTP + WebSocket, and phone calls")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--trace-dir", help="write a Perfetto trace (+ JSONL log) per session here")
    p.add_argument("--audiosocket", type=int, metavar="PORT",
                   help="also take phone calls from Asterisk's AudioSocket on this TCP port (SIP through a PBX)")
    p.add_argument("--audiosocket-allow", action="append", metavar="CIDR",
                   help="an address or network AudioSocket calls may come from (repeatable; default "
                        "127.0.0.0/8 and ::1: an Asterisk on this machine). AudioSocket has no credentials")
    p.add_argument("--insecure-no-auth", action="store_true",
                   help="serve off loopback (--host 0.0.0.0) with no --auth-token, every route open to "
                        "anyone who reaches the port; without it duplex serve refuses to start so")
    p.add_argument("--listener", action="append", metavar="MODULE:FUNCTION[=ARG]",
                   help="also serve a transport of your own: FUNCTION(ARG) in MODULE returns its listener "
                        "(docs/extending.md, 'A transport'; e.g. examples.pcm_tcp_transport:listener=9100); "
                        "repeatable")
    p.add_argument("--max-sessions", type=positive_int, default=16,
                   help="conversations at once, every route and port together (default 16); beyond it, or "
                        "when the load is too high, a page gets HTTP 503 before its WebSocket opens and a "
                        "phone call hears that all lines are busy")
    p.add_argument("--load-threshold", type=float, default=0.8,
                   help="refuse new conversations while the machine's CPU use (averaged over 3 s, plus 30%% "
                        "for each conversation admitted in the last 4 s) is above this (default 0.8; 0: "
                        "only --max-sessions). An idle server always takes one")
    p.add_argument("--drain-timeout", type=float, default=30.0,
                   help="on SIGTERM/SIGINT: stop admitting, let live conversations end for up to this many "
                        "seconds (default 30), then say goodbye to the rest and exit 0")
    p.add_argument("--metrics-port", type=int, metavar="PORT",
                   help="serve /metrics, and /readyz with its reasons, on this port only (a proxy in front of "
                        "--port then shows neither; /readyz there gives the status alone)")
    p.add_argument("--idle-timeout", type=float, default=60.0, metavar="S",
                   help="end a conversation in which no one has spoken and no reply has played for this "
                        "long (default 60; 0: never): a page is told why, a phone hears a goodbye")
    p.add_argument("--max-call", type=float, default=3600.0, metavar="S",
                   help="end any conversation after this long, with a goodbye (default 3600; 0: no limit)")
    p.add_argument("--max-per-source", type=int, default=8, metavar="N",
                   help="conversations at once from one address on /ws, WebRTC and unguarded phone routes "
                        "(default 8; 0: no limit). Loopback is exempt: behind a proxy every caller is it")
    p.add_argument("--connect-rate", type=float, default=60.0, metavar="PER_MINUTE",
                   help="new conversations a minute from one address on those routes, bursts of 20 "
                        "allowed (default 60; 0: no limit); beyond it HTTP 429")
    p.add_argument("--trusted-proxy", action="append", metavar="CIDR",
                   help="a reverse proxy in front (repeatable): requests from it are counted by the "
                        "address in its X-Forwarded-For for --max-per-source and --connect-rate")
    p.add_argument("--twilio-auth-token", default=os.environ.get("TWILIO_AUTH_TOKEN") or None,
                   help="check Twilio's X-Twilio-Signature on /twilio with this account auth token "
                        "(default: $TWILIO_AUTH_TOKEN)")
    p.add_argument("--plivo-auth-token", default=os.environ.get("PLIVO_AUTH_TOKEN") or None,
                   help="check Plivo's X-Plivo-Signature-V3 on /plivo (default: $PLIVO_AUTH_TOKEN)")
    p.add_argument("--vonage-signature-secret", default=os.environ.get("VONAGE_SIGNATURE_SECRET") or None,
                   help="check the signed JWT Vonage sends on /vonage (NCCO websocket endpoint with "
                        "authorization type vonage; default: $VONAGE_SIGNATURE_SECRET)")
    p.add_argument("--vonage-application-id", default=os.environ.get("VONAGE_APPLICATION_ID") or None,
                   help="also require this application_id claim in Vonage's JWT")
    p.add_argument("--public-url", default=os.environ.get("DUPLEX_PUBLIC_URL") or None,
                   help="the wss:// base URL the carriers were given, when a proxy's Host differs "
                        "(default: wss:// + the Host header); carriers sign that URL")
    p.add_argument("--certfile", help="serve HTTPS/WSS with this PEM certificate (chain); see docs/serving.md")
    p.add_argument("--keyfile", help="the certificate's private key (PEM), if not in --certfile")
    p.add_argument("--auth-token", default=os.environ.get("DUPLEX_AUTH_TOKEN") or None,
                   help="/ws then requires ?token=TOKEN or 'Authorization: Bearer TOKEN' (else HTTP 401); "
                        "default: $DUPLEX_AUTH_TOKEN. Open the page as http://HOST:PORT/?token=TOKEN")
    p.add_argument("--allowed-origin", action="append", metavar="ORIGIN",
                   help="a web origin (scheme://host[:port]) whose pages may open /ws; repeat for more. "
                        "The server's own origin always may; default: also http(s)://localhost and "
                        "127.0.0.1 on any port. A browser from any other origin gets HTTP 403")
    p.add_argument("--allowed-host", action="append", metavar="NAME",
                   help="a host name clients may reach this server by (the Host header); repeat for more. "
                        "IP addresses, localhost and --host always may, and so may --public-url's host; "
                        "any other name gets HTTP 403, which defeats DNS rebinding")
    p.add_argument("--ice-host", action="append", metavar="IP",
                   help="WebRTC: gather only this host address as an ICE candidate (repeat for more; "
                        "e.g. 127.0.0.1 for a page on this machine); default: every interface's address")
    p.add_argument("--ice-server", action="append", metavar="URL",
                   help="WebRTC: a STUN or TURN server, stun:HOST:PORT or USER:PASSWORD@turn:HOST:PORT"
                        "?transport=udp (repeatable; aiortc uses the first of each kind), or "
                        "turn:HOST:PORT?transport=udp with --turn-secret. The page gets the same list "
                        "(GET /webrtc/config), credentials included. Needed across NATs on the internet; "
                        "host candidates are enough on a LAN or localhost")
    p.add_argument("--turn-secret", default=os.environ.get("DUPLEX_TURN_SECRET") or None,
                   help="coturn's static-auth-secret (use-auth-secret): each page and each offer gets "
                        "credentials of its own for the turn: --ice-server URLs given without any, "
                        "valid for --turn-ttl. Default: $DUPLEX_TURN_SECRET (the environment keeps it "
                        "out of ps)")
    p.add_argument("--turn-ttl", type=float, default=600.0, metavar="SECONDS",
                   help="how long --turn-secret credentials may be used to open a relay (default "
                        "600); a call that has opened one may outlast them")
    _trace_args(p)
    _model_args(p)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("talk", help="talk to the agent through this machine's microphone and speaker (headphones)")
    p.add_argument("--input-device", help="microphone: a PortAudio device number or name (default: the system's)")
    p.add_argument("--output-device", help="speaker: a PortAudio device number or name (default: the system's)")
    p.add_argument("--list-devices", action="store_true", help="list the sound devices and exit")
    p.add_argument("--seconds", type=float, default=None, help="end the conversation after this long")
    p.add_argument("--trace", help="write a Perfetto trace here (and a JSONL event log beside it)")
    _trace_args(p)
    _model_args(p)
    p.set_defaults(func=cmd_talk)

    p = sub.add_parser("run", help="hold a conversation from WAV files; write the bot's channel to a WAV")
    p.add_argument("--input", action="append", required=True,
                   help="a user turn (WAV); repeat for more turns. FILE@+S starts it S seconds after the "
                        "previous input ended instead of after the reply, FILE@reply+S S seconds after "
                        "the reply to it began playing (to talk over the bot)")
    p.add_argument("--output", required=True, help="WAV of the bot's channel, aligned with the input")
    p.add_argument("--log", help="write per-turn JSON lines here too")
    p.add_argument("--gap", type=float, default=1.0, help="silence after a reply before the next input (s)")
    p.add_argument("--reply-timeout", type=float, default=30.0,
                   help="give up waiting for a reply after this many seconds (then the next input plays)")
    p.add_argument("--fast", action="store_true", help="feed input as fast as possible (latencies meaningless)")
    p.add_argument("--trace", help="write a Perfetto trace here (and a JSONL event log beside it)")
    p.add_argument("--far-end-log", help="write what the far end received and played (JSON lines)")
    _trace_args(p)
    _model_args(p)
    p.set_defaults(func=cmd_run)

    sub.add_parser("asr-serve", help="Kyutai-compatible streaming ASR server (see asr/PROTOCOL.md)")
    sub.add_parser("asr-bench", help="load client and engine benchmarks for the ASR server")
    sub.add_parser("trace", help="trace tools: `duplex trace report TRACE`")
    sub.add_parser("bench", help="benchmarks: `duplex bench latency` (concurrent vs waterfall), "
                                 "`duplex bench turns` (end-of-turn policies: latency and false cut-offs), "
                                 "`duplex bench pipecat` (the pipecat bot on duplex's services vs pipecat's own), "
                                 "`duplex bench load` (conversations at once against a running server), "
                                 "`duplex bench soak` (sequential conversations, RSS), "
                                 "`duplex bench overlap` (pauses, turn-taking and speech over the bot, "
                                 "Full-Duplex-Bench's way, through the page's protocol)")

    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
