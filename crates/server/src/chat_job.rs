//! A chat request made ready to run: the one path `/v1/chat/completions`, LMI `messages`
//! bodies, the Responses API and Anthropic's Messages API share (chat template, tools offered
//! to the model, `auto` tool choice allowed or not, constraints compiled).

use lmi_api::ApiError;
use lmi_api::openai::{ChatRequest, ToolChoice, ToolSpec};

use crate::app::{AppState, LoadedModel};
use crate::generation::{self, Job, Prompt};
use crate::tool_calls;

pub struct ChatJob {
    pub job: Job,
    /// The tools the reply is read for (none with `tool_choice: "none"`).
    pub tools: Option<ToolSpec>,
}

pub fn prepare(
    state: &AppState,
    model: &LoadedModel,
    req: &ChatRequest,
) -> Result<ChatJob, ApiError> {
    // Tools the reply is read for; `tool_choice: "none"` shows the model none.
    let tools = req.tools.clone().filter(|t| t.active());
    let mut spec = req.spec.clone();
    if let Some(t) = &tools {
        if t.choice == ToolChoice::Auto && !state.config.enable_auto_tool_choice {
            return Err(ApiError::validation(
                "\"auto\" tool choice is turned off on this server \
                 (option.enable_auto_tool_choice=false): send tool_choice \"required\", \
                 \"none\" or a named function",
            )
            .with_param("tool_choice"));
        }
        if tool_calls::reads_special_tokens(model.tool_format) {
            spec.skip_special_tokens = false;
        }
        // gpt-oss writes a forced call as its own message, not as the bare JSON the request
        // was parsed for.
        if let Some(g) = tool_calls::harmony_forced_grammar(t)
            .filter(|_| model.tool_format == lmi_text::ToolCallFormat::Harmony)
        {
            spec.constraint = Some(lmi_api::Constraint::Grammar(g));
        }
    }
    let offered: Vec<serde_json::Value> = tools
        .iter()
        .flat_map(|t| t.offered().iter().map(|tool| tool.raw.clone()))
        .collect();
    let messages = generation::chat_messages(&req.messages)?;
    let prompt = Prompt::Chat {
        messages,
        tools: offered,
        kwargs: req.reasoning.template_kwargs.clone(),
        budget: req.reasoning.budget,
    };
    let job = generation::prepare(model, prompt, spec)?;
    Ok(ChatJob { job, tools })
}
