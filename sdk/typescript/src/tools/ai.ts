/**
 * The sandbox's tools for the Vercel AI SDK (`npm install ai zod`).
 *
 *     import { generateText, stepCountIs } from "ai";
 *     import { Sandbox } from "mentis-sandbox";
 *     import { sandboxTools } from "mentis-sandbox/ai";
 *
 *     await using sb = await Sandbox.create();
 *     const { text } = await generateText({
 *       model,                         // any model that calls tools
 *       tools: sandboxTools(sb),       // run_shell, run_python, read_file, write_file, list_files
 *       stopWhen: stepCountIs(10),
 *       prompt: "What is 6 times 7? Compute it in Python.",
 *     });
 *
 * Each tool returns text for the model: a command's exit code, stdout and stderr; a cell's printed text,
 * results and error; a file's content. Long text is cut in the middle to `limit` characters, with a note
 * saying so. A command that fails is an answer with its exit code. A call the runtime refuses (a missing
 * file, a sandbox gone) throws a `SandboxToolError` whose message is the text the model reads: the AI SDK
 * turns it into the call's tool error, sends it to the model, and the loop goes on. The AI SDK's
 * `abortSignal` cancels a running command or interrupts a running cell.
 */
import { type Tool, tool } from "ai";
import type { z } from "zod";
import type { Sandbox } from "../sandbox.js";
import {
  type CallOptions,
  checkArguments,
  guarded,
  LIST_FILES,
  listFiles,
  READ_FILE,
  readFile,
  RUN_PYTHON,
  RUN_SHELL,
  runPython,
  runShell,
  SandboxToolError,
  type SandboxToolsOptions,
  type ToolSpec,
  WRITE_FILE,
  writeFile,
} from "./common.js";
import { listFilesSchema, readFileSchema, runPythonSchema, runShellSchema, writeFileSchema } from "./schemas.js";

export { clip, DEFAULT_LIMIT, SandboxToolError, type SandboxToolsOptions } from "./common.js";

/** The sandbox's tools as the AI SDK takes them (`generateText({ tools })`), keyed by name (a type alias, not an
 * interface, so that it is a `ToolSet`). */
export type SandboxTools = {
  /** A bash command: its exit code, stdout and stderr. */
  run_shell: Tool<z.output<typeof runShellSchema>, string>;
  /** A cell of the sandbox's IPython kernel: what it printed, its results and its error. */
  run_python: Tool<z.output<typeof runPythonSchema>, string>;
  /** A text file's content. */
  read_file: Tool<z.output<typeof readFileSchema>, string>;
  /** Text written to a file. */
  write_file: Tool<z.output<typeof writeFileSchema>, string>;
  /** A folder's entries, one a line. */
  list_files: Tool<z.output<typeof listFilesSchema>, string>;
};

/**
 * The tools `run_shell`, `run_python`, `read_file`, `write_file` and `list_files` on `sandbox`, as AI SDK
 * tools keyed by name. `limit` is the most characters of one answer given to the model (the middle of a
 * longer one is cut, with a note; 0: no limit; default 20,000).
 */
export function sandboxTools(sandbox: Sandbox, options: SandboxToolsOptions = {}): SandboxTools {
  const { sandbox: target, limit } = checkArguments(sandbox, options);

  function make<S extends z.ZodType>(
    spec: ToolSpec,
    inputSchema: S,
    call: (sb: Sandbox, args: z.output<S>, options: CallOptions) => Promise<string>,
  ): Tool<z.output<S>, string> {
    return tool<z.output<S>, string>({
      description: spec.description,
      inputSchema,
      execute: (args, { abortSignal }) =>
        guarded(
          () => call(target, args, { limit, signal: abortSignal }),
          (e) => {
            throw new SandboxToolError(e);
          },
        ),
    });
  }

  return {
    run_shell: make(RUN_SHELL, runShellSchema, runShell),
    run_python: make(RUN_PYTHON, runPythonSchema, runPython),
    read_file: make(READ_FILE, readFileSchema, readFile),
    write_file: make(WRITE_FILE, writeFileSchema, writeFile),
    list_files: make(LIST_FILES, listFilesSchema, listFiles),
  };
}
