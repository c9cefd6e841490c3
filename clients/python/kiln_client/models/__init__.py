"""Contains all the data models used in inputs/outputs"""

from .active_out import ActiveOut
from .alive_response_alive import AliveResponseAlive
from .backend_request import BackendRequest
from .backend_request_options import BackendRequestOptions
from .body_upload_model import BodyUploadModel
from .compile_in import CompileIn
from .compile_out import CompileOut
from .default_version_in import DefaultVersionIn
from .healthz_response_healthz import HealthzResponseHealthz
from .inference_request import InferenceRequest
from .inference_request_parameters import InferenceRequestParameters
from .inference_response import InferenceResponse
from .inference_response_parameters import InferenceResponseParameters
from .job_out import JobOut
from .job_out_options import JobOutOptions
from .job_out_tuning_type_0 import JobOutTuningType0
from .job_status import JobStatus
from .log_settings import LogSettings
from .log_settings_log_format import LogSettingsLogFormat
from .model_list import ModelList
from .model_out import ModelOut
from .model_ready_response import ModelReadyResponse
from .output_info import OutputInfo
from .predict_in import PredictIn
from .predict_in_inputs import PredictInInputs
from .predict_out import PredictOut
from .predict_out_outputs import PredictOutOutputs
from .predict_response import PredictResponse
from .problem import Problem
from .protocol_error import ProtocolError
from .readyz_response_readyz import ReadyzResponseReadyz
from .region import Region
from .request_input import RequestInput
from .request_input_parameters import RequestInputParameters
from .request_output import RequestOutput
from .request_output_parameters import RequestOutputParameters
from .response_output import ResponseOutput
from .response_output_parameters import ResponseOutputParameters
from .server_live_response import ServerLiveResponse
from .server_ready_response import ServerReadyResponse
from .serving_config import ServingConfig
from .serving_config_labels import ServingConfigLabels
from .serving_in import ServingIn
from .serving_in_labels_type_0 import ServingInLabelsType0
from .skipped_out import SkippedOut
from .skipped_out_options import SkippedOutOptions
from .tensor_config import TensorConfig
from .tensor_config_dtype import TensorConfigDtype
from .trace_settings_doc import TraceSettingsDoc
from .upload_out import UploadOut
from .v1_protocol_metadata_response_v1_protocol_metadata import V1ProtocolMetadataResponseV1ProtocolMetadata
from .v1_protocol_predict_predict_request import V1ProtocolPredictPredictRequest
from .v1_protocol_predict_predict_request_parameters_type_0 import V1ProtocolPredictPredictRequestParametersType0
from .v1_protocol_predict_predict_request_signature_name_type_0 import V1ProtocolPredictPredictRequestSignatureNameType0
from .v1_protocol_predict_version_predict_request import V1ProtocolPredictVersionPredictRequest
from .v1_protocol_predict_version_predict_request_parameters_type_0 import (
    V1ProtocolPredictVersionPredictRequestParametersType0,
)
from .v1_protocol_predict_version_predict_request_signature_name_type_0 import (
    V1ProtocolPredictVersionPredictRequestSignatureNameType0,
)
from .v1_protocol_version_metadata_response_v1_protocol_version_metadata import (
    V1ProtocolVersionMetadataResponseV1ProtocolVersionMetadata,
)
from .v2_all_stats_response_v2_all_stats import V2AllStatsResponseV2AllStats
from .v2_model_config_response_v2_model_config import V2ModelConfigResponseV2ModelConfig
from .v2_model_metadata_response_v2_model_metadata import V2ModelMetadataResponseV2ModelMetadata
from .v2_model_stats_response_v2_model_stats import V2ModelStatsResponseV2ModelStats
from .v2_model_version_config_response_v2_model_version_config import V2ModelVersionConfigResponseV2ModelVersionConfig
from .v2_model_version_metadata_response_v2_model_version_metadata import (
    V2ModelVersionMetadataResponseV2ModelVersionMetadata,
)
from .v2_model_version_stats_response_v2_model_version_stats import V2ModelVersionStatsResponseV2ModelVersionStats
from .v2_repository_index_index_request import V2RepositoryIndexIndexRequest
from .v2_repository_index_response_200_item import V2RepositoryIndexResponse200Item
from .v2_repository_load_load_in import V2RepositoryLoadLoadIn
from .v2_repository_load_load_in_parameters import V2RepositoryLoadLoadInParameters
from .v2_server_metadata_response_v2_server_metadata import V2ServerMetadataResponseV2ServerMetadata
from .v2_shared_memory_register_register_in import V2SharedMemoryRegisterRegisterIn
from .v2_update_log_settings_log_settings_in import V2UpdateLogSettingsLogSettingsIn
from .v2_update_log_settings_log_settings_in_log_format_type_0 import V2UpdateLogSettingsLogSettingsInLogFormatType0
from .v2_update_model_trace_settings_trace_settings_in import V2UpdateModelTraceSettingsTraceSettingsIn
from .v2_update_model_trace_settings_trace_settings_in_trace_level_type_0_item import (
    V2UpdateModelTraceSettingsTraceSettingsInTraceLevelType0Item,
)
from .v2_update_trace_settings_trace_settings_in import V2UpdateTraceSettingsTraceSettingsIn
from .v2_update_trace_settings_trace_settings_in_trace_level_type_0_item import (
    V2UpdateTraceSettingsTraceSettingsInTraceLevelType0Item,
)
from .variant_out import VariantOut
from .variant_out_baseline_latency_ms_by_batch import VariantOutBaselineLatencyMsByBatch
from .variant_out_latency_ms_by_batch import VariantOutLatencyMsByBatch
from .variant_out_options import VariantOutOptions
from .variant_ref import VariantRef
from .variant_status import VariantStatus
from .version_out import VersionOut

__all__ = (
    "ActiveOut",
    "AliveResponseAlive",
    "BackendRequest",
    "BackendRequestOptions",
    "BodyUploadModel",
    "CompileIn",
    "CompileOut",
    "DefaultVersionIn",
    "HealthzResponseHealthz",
    "InferenceRequest",
    "InferenceRequestParameters",
    "InferenceResponse",
    "InferenceResponseParameters",
    "JobOut",
    "JobOutOptions",
    "JobOutTuningType0",
    "JobStatus",
    "LogSettings",
    "LogSettingsLogFormat",
    "ModelList",
    "ModelOut",
    "ModelReadyResponse",
    "OutputInfo",
    "PredictIn",
    "PredictInInputs",
    "PredictOut",
    "PredictOutOutputs",
    "PredictResponse",
    "Problem",
    "ProtocolError",
    "ReadyzResponseReadyz",
    "Region",
    "RequestInput",
    "RequestInputParameters",
    "RequestOutput",
    "RequestOutputParameters",
    "ResponseOutput",
    "ResponseOutputParameters",
    "ServerLiveResponse",
    "ServerReadyResponse",
    "ServingConfig",
    "ServingConfigLabels",
    "ServingIn",
    "ServingInLabelsType0",
    "SkippedOut",
    "SkippedOutOptions",
    "TensorConfig",
    "TensorConfigDtype",
    "TraceSettingsDoc",
    "UploadOut",
    "V1ProtocolMetadataResponseV1ProtocolMetadata",
    "V1ProtocolPredictPredictRequest",
    "V1ProtocolPredictPredictRequestParametersType0",
    "V1ProtocolPredictPredictRequestSignatureNameType0",
    "V1ProtocolPredictVersionPredictRequest",
    "V1ProtocolPredictVersionPredictRequestParametersType0",
    "V1ProtocolPredictVersionPredictRequestSignatureNameType0",
    "V1ProtocolVersionMetadataResponseV1ProtocolVersionMetadata",
    "V2AllStatsResponseV2AllStats",
    "V2ModelConfigResponseV2ModelConfig",
    "V2ModelMetadataResponseV2ModelMetadata",
    "V2ModelStatsResponseV2ModelStats",
    "V2ModelVersionConfigResponseV2ModelVersionConfig",
    "V2ModelVersionMetadataResponseV2ModelVersionMetadata",
    "V2ModelVersionStatsResponseV2ModelVersionStats",
    "V2RepositoryIndexIndexRequest",
    "V2RepositoryIndexResponse200Item",
    "V2RepositoryLoadLoadIn",
    "V2RepositoryLoadLoadInParameters",
    "V2ServerMetadataResponseV2ServerMetadata",
    "V2SharedMemoryRegisterRegisterIn",
    "V2UpdateLogSettingsLogSettingsIn",
    "V2UpdateLogSettingsLogSettingsInLogFormatType0",
    "V2UpdateModelTraceSettingsTraceSettingsIn",
    "V2UpdateModelTraceSettingsTraceSettingsInTraceLevelType0Item",
    "V2UpdateTraceSettingsTraceSettingsIn",
    "V2UpdateTraceSettingsTraceSettingsInTraceLevelType0Item",
    "VariantOut",
    "VariantOutBaselineLatencyMsByBatch",
    "VariantOutLatencyMsByBatch",
    "VariantOutOptions",
    "VariantRef",
    "VariantStatus",
    "VersionOut",
)
