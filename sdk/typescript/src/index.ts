/**
 * MentisSandbox's TypeScript client: sandboxes for AI agents, with shell commands, stateful IPython cells,
 * files, terminals, processes, snapshots, preview URLs and templates, over the runtime's gRPC API.
 *
 *     import { Sandbox } from "mentis-sandbox";
 *
 *     await using sb = await Sandbox.create();
 *     console.log((await sb.run("echo hi")).stdout);
 *     console.log((await sb.runCode("6 * 7")).results[0]?.text);
 *
 * The runtime's address and key come from options or `MENTIS_ADDR` / `MENTIS_API_KEY`; with neither, a
 * `mentis-runtime` on PATH (or `MENTIS_RUNTIME_BIN`) is started for the process (embedded mode).
 */
export { Connection, type ConnectionOptions, type Settings, parseAddr, resolveSettings } from "./client.js";
export { runtimeBinary, stopEmbedded } from "./embedded.js";
export {
  Aborted,
  AlreadyExists,
  Cancelled,
  ConfigError,
  DeadlineExceeded,
  FailedPrecondition,
  Internal,
  InvalidArgument,
  MentisError,
  NotFound,
  OutOfRange,
  PermissionDenied,
  ResourceExhausted,
  Unauthenticated,
  Unavailable,
} from "./errors.js";
export {
  type CellError,
  type CellOutput,
  type CellResult,
  CommandResult,
  type EndReasonName,
  type RunCodeOptions,
  type RunOptions,
} from "./actions.js";
export {
  CommandHandle,
  type EgressMode,
  type EgressRule,
  type ListSandboxesOptions,
  type PreviewUrl,
  Sandbox,
  type SandboxCreateOptions,
  type SandboxInfo,
  type SandboxStateName,
} from "./sandbox.js";
export { type EditResult, type FileInfo, Files, type WriteData } from "./files.js";
export { type FileEvent, type FileEventType, FileWatch } from "./watch.js";
export { type ProcessInfo, Processes } from "./processes.js";
export {
  type TerminalAttachOptions,
  Terminal,
  TerminalEnded,
  type TerminalInfo,
  type TerminalLink,
  type TerminalOpenOptions,
  Terminals,
  type TerminalSignal,
  type WaitOptions,
} from "./terminals.js";
export { type ListSnapshotsOptions, type Snapshot, type SnapshotOptions, Snapshots } from "./snapshots.js";
export { type EgressDenial, Secrets, type SecretsOptions } from "./egress.js";
export { type ServiceOptions } from "./service.js";
export {
  type BuildImageOptions,
  type BuiltImage,
  type ImportImageOptions,
  type TarSource,
  type Template,
  type TemplateChanges,
  type TemplateFields,
  Templates,
} from "./templates.js";
