"""The parity command is a thin layer over option groups: its function takes the context and
click's keyword arguments, and every flag lands in exactly one group of ``ParityOptions``."""

from __future__ import annotations

import dataclasses
import inspect
import typing

from contractgen.commands.parity import ParityOptions, command


def test_command_function_takes_a_handful_of_parameters() -> None:
    params = inspect.signature(inspect.unwrap(command.callback)).parameters
    assert len(params) <= 3, list(params)


def test_every_flag_lands_in_exactly_one_group() -> None:
    names = [p.name for p in command.params]
    groups = typing.get_type_hints(ParityOptions).values()
    fields = [f.name for group in groups for f in dataclasses.fields(group)]
    assert sorted(fields) == sorted(names)


def test_from_params_keeps_every_value() -> None:
    ctx = command.make_context("parity", ["--layouts", "tp1", "--lora", "8", "--train-steps", "2"])
    opts = ParityOptions.from_params(ctx.params)
    assert opts.layouts.layouts == "tp1"
    assert opts.lora.lora == "8"
    assert opts.training.train_steps == 2
    assert opts.model.contract_id == "qwen3_dense_true_on_policy_v1"
    assert opts.workload.sizes() == (4, 176, 10)
